#!/bin/sh
# The restart oracle: a job of PROCS ranks under actorpipe-launch --max-restarts is killed with
# SIGKILL (a random rank, at a random moment after it made progress) KILLS times; it must finish
# by itself and its final checkpoint must be byte for byte the one of an uninterrupted job, and
# its metrics must hold every step once. RELAUNCH (--relaunch): all, every rank is started again
# after each kill; dead, only the killed rank is, and the others live on and rejoin the job (each
# kill must leave the other ranks' processes running). Every process it starts is ended before
# it returns.
# usage: sh kill_restart.sh GPT LAUNCHER WORKDIR MODE PROCS KILLS SEED RELAUNCH
gpt=$1
launcher=$2
dir=$3
mode=$4
procs=$5
kills=$6
seed=$7
relaunch=$8
case $relaunch in
all) restarted="restarting every rank" ;;
dead) restarted="relaunching rank" ;;
*) echo "usage: RELAUNCH is all or dead, not '$relaunch'"; exit 2 ;;
esac
# enough steps that the job outlives its kills: each kill comes 1-20 steps (two checkpoint
# intervals) after the restart's first step, plus up to 20 ms (the 10 ms poll that sees the step
# and a random 0-9 ms), and rolls the job back to its last checkpoint; so 20 kills advance the job
# by at most 20 x 20 steps and the steps of 20 x 20 ms: under 1000 unless a step takes under 1 ms
# (here about 4 ms)
steps=1000
every=10
# a small GPT (27k parameters): the oracle is about where the kills land, not the model's size,
# and the two jobs of 1000 steps take about 4 s each instead of 35 s at the default size
small="--set model.vocab_size=32 --set model.context=16 --set model.width=32 --set model.heads=2"
# (--relaunch dead: a survivor UCX ends is relaunched too, a second restart for one kill)
limit=$((kills + 5))
[ "$relaunch" = dead ] && limit=$((2 * kills + 5))
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1

exec_job=
# the job under the launcher, with the extra --set arguments; with exec_job set, the calling
# shell becomes the launcher (so that $! is the launcher, the ranks' parent)
job() {
  set -- "$launcher" -n "$procs" --max-restarts $limit --relaunch "$relaunch" \
    --restart-backoff 0 --grace 5 -- \
    "$gpt" --set pipeline.mode="$mode" --set train.steps=$steps --set checkpoint.every=$every \
    --set train.log_every=100 $small "$@"
  if [ -n "$exec_job" ]; then exec "$@"; fi
  "$@"
}
launcher_pid=
# the last step in the metrics (0 while the last line is another record, or is being written:
# a relaunched rank 0 rewrites the file, and a read then may see anything)
last_step() {
  v=$(tail -n 1 m.jsonl 2>/dev/null | sed -n 's/^{"step":\([0-9]*\).*/\1/p' | head -n 1)
  case $v in
  '' | *[!0-9]*) echo 0 ;;
  *) echo "$v" ;;
  esac
}
# grep -c of a file that may not be there yet (0) or is being rewritten: always one number
count() {
  v=$(grep -c "$1" "$2" 2>/dev/null | head -n 1)
  case $v in
  '' | *[!0-9]*) echo 0 ;;
  *) echo "$v" ;;
  esac
}
fail() {
  echo "FAILED: $1"
  [ -n "$launcher_pid" ] && kill -KILL "$launcher_pid" 2>/dev/null  # the ranks die with it
  [ -f out ] && { echo "--- output of the killed job (last 40 lines)"; tail -n 40 out; }
  exit 1
}

job --set checkpoint.dir=whole >whole.out 2>&1 || { cat whole.out; fail "the uninterrupted job"; }

(
  exec_job=1
  job --set checkpoint.dir=run --set train.metrics=m.jsonl
) >out 2>&1 &
launcher_pid=$!
# a small linear congruential generator: the same kills for the same seed
rand=$seed
next_rand() { rand=$(((rand * 1103515245 + 12345) % 2147483648)); }
k=0
survivors=
lived=0
ended=0
while [ $k -lt "$kills" ]; do
  # progress since the last kill
  i=0
  while :; do
    i=$((i + 1))
    [ $i -le 1200 ] || fail "no progress 60 s after kill $k"
    kill -0 "$launcher_pid" 2>/dev/null || fail "the job ended after $k of $kills kills"
    # every kill so far has been restarted, the latest relaunch has written its restart line,
    # and a step came after it
    restarts=$(count "$restarted" out)
    lines=$(count '^{"restart":' m.jsonl)
    # (--relaunch dead: UCX may end a survivor too, which is relaunched as well)
    if [ "$restarts" -ge $k ] && [ "$lines" -ge $k ] &&
      tail -n 1 m.jsonl | grep -q '^{"step":'; then
      break
    fi
    sleep 0.05
  done
  # --relaunch dead: the last kill's survivors are the same processes, training again
  children=$(pgrep -P "$launcher_pid" | tr '\n' ' ')
  for p in $survivors; do
    case " $children" in
    *" $p "*) lived=$((lived + 1)) ;;
    *) ended=$((ended + 1)) ;;
    esac
  done
  # a random moment: 1-20 steps on, before or after the next checkpoint (counted in steps, not
  # seconds, so that the job's progress between kills does not grow with the machine's speed),
  # then 0-9 ms on (a few steps: into one, or a checkpoint, or between)
  next_rand
  target=$(($(last_step) + rand / 65536 % (2 * every) + 1))
  i=0
  while [ "$(last_step)" -lt "$target" ]; do
    i=$((i + 1))
    [ $i -le 6000 ] || fail "no step $target 60 s after kill $k"
    kill -0 "$launcher_pid" 2>/dev/null || fail "the job ended after $k of $kills kills"
    sleep 0.01
  done
  next_rand
  sleep "$(printf '0.%03d' $((rand / 65536 % 10)))"
  ranks=$(pgrep -P "$launcher_pid")
  n=$(echo "$ranks" | wc -w)
  [ "$n" -eq "$procs" ] || continue  # between attempts: try again
  next_rand
  # (the high bits: an LCG's lowest bit alternates, which would always pick the same index)
  victim=$(echo "$ranks" | tr ' ' '\n' | sed -n "$((rand / 65536 % n + 1))p")
  kill -KILL "$victim" 2>/dev/null || continue
  k=$((k + 1))
  # the others, by process id: with --relaunch dead they must still run after the restart
  survivors=$(echo "$ranks" | tr ' ' '\n' | grep -v "^$victim\$")
  echo "kill $k: pid $victim at step $(last_step)"
done
wait "$launcher_pid"
code=$?
launcher_pid=
[ "$code" -eq 0 ] || fail "the job exited with $code"
restarts=$(grep -c "$restarted" out)
echo "the job finished after $restarts restarts"
[ "$restarts" -ge "$kills" ] || fail "$restarts restarts for $kills kills"
grep -q "relaunch [0-9]* of $limit (actorpipe-launch --max-restarts) after: rank [0-9] killed by signal 9 (SIGKILL)" out ||
  fail "no relaunch message"
if [ "$relaunch" = dead ]; then
  # a survivor leaves the failed run within its bound (about a second here; the bound is
  # cluster.peer_timeout + 5 s): one that outlasts it exits and is relaunched, which the job
  # survives, but a teardown that hangs is what this oracle is also there to catch
  slow=$(grep -c "leaving the failed run took longer" out)
  [ "$slow" -eq 0 ] || fail "$slow survivors outlasted their bound for leaving the failed run"
  # a survivor reading the killed rank's memory at that instant (UCX's shared-memory rendezvous,
  # process_vm_readv) is ended by UCX with SIGABRT and relaunched too; any other relaunch is a
  # killed rank's
  aborted=$(grep -c "^actorpipe-launch: rank [0-9]* killed by signal 6 (SIGABRT)" out)
  [ "$restarts" -eq $((kills + aborted)) ] ||
    fail "$restarts relaunches for $kills kills and $aborted survivors that gave up"
  [ "$ended" -le "$aborted" ] || fail "$ended survivors were started again, $aborted gave up"
  [ "$lived" -ge $(((kills - 1) / 2)) ] || fail "only $lived survivors of $kills kills lived on"
  grep -q "rejoin [0-9]* of $limit (actorpipe-launch --max-restarts) after: " out ||
    fail "rank 0 never rejoined the job"
  echo "survivors that lived on and rejoined: $lived; that gave up and were relaunched: $aborted"
fi
for f in whole/final/*; do
  name=$(basename "$f")
  cmp "$f" "run/final/$name" || fail "run/final/$name differs from the uninterrupted job's"
done
n=$(grep -c '^{"step":' m.jsonl)
[ "$n" -eq "$steps" ] || fail "$n step lines in the metrics, expected $steps (each step once)"
# rank 0 writes one restart line per restart of its own: each relaunch of the whole job, or (dead)
# each kill, which rank 0 either survived and rejoined or was relaunched after
expected=$restarts
[ "$relaunch" = dead ] && expected=$kills
r=$(grep -c '^{"restart":' m.jsonl)
if [ "$r" -ne "$expected" ]; then
  # which restarts had no kill behind them: each one's reason
  echo "--- the launcher's restarts"
  grep "$restarted" out
  fail "$r restart lines in the metrics, expected $expected"
fi
echo "the restarted job equals the uninterrupted one"
