#!/bin/sh
# The restart oracle: a job of PROCS ranks under actorpipe-launch --max-restarts is killed with
# SIGKILL (a random rank, at a random moment after it made progress) KILLS times; it must finish
# by itself and its final checkpoint must be byte for byte the one of an uninterrupted job, and
# its metrics must hold every step once. Every process it starts is ended before it returns.
# usage: sh kill_restart.sh GPT LAUNCHER WORKDIR MODE PROCS KILLS SEED
gpt=$1
launcher=$2
dir=$3
mode=$4
procs=$5
kills=$6
seed=$7
# enough steps that the job outlives its kills on a fast machine: each kill comes 0.1-0.4 s after
# a step (a few tens of steps), and rolls the job back to its last checkpoint
steps=600
every=10
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1

exec_job=
# the job under the launcher, with the extra --set arguments; with exec_job set, the calling
# shell becomes the launcher (so that $! is the launcher, the ranks' parent)
job() {
  set -- "$launcher" -n "$procs" --max-restarts $((kills + 5)) --restart-backoff 0 --grace 5 -- \
    "$gpt" --set pipeline.mode="$mode" --set train.steps=$steps --set checkpoint.every=$every \
    --set train.log_every=100 "$@"
  if [ -n "$exec_job" ]; then exec "$@"; fi
  "$@"
}
launcher_pid=
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
while [ $k -lt "$kills" ]; do
  # progress since the last kill
  i=0
  while :; do
    i=$((i + 1))
    [ $i -le 1200 ] || fail "no progress 60 s after kill $k"
    kill -0 "$launcher_pid" 2>/dev/null || fail "the job ended after $k of $kills kills"
    # every kill so far has been restarted, the latest relaunch has written its restart line,
    # and a step came after it
    restarts=$(grep -c "restarting every rank" out)
    lines=$(grep -c '^{"restart":' m.jsonl 2>/dev/null)
    if [ "$restarts" -eq $k ] && [ "${lines:-0}" -eq $k ] &&
      tail -n 1 m.jsonl | grep -q '^{"step":'; then
      break
    fi
    sleep 0.05
  done
  next_rand
  sleep "0.$((rand % 300 + 100))"
  ranks=$(pgrep -P "$launcher_pid")
  n=$(echo "$ranks" | wc -w)
  [ "$n" -eq "$procs" ] || continue  # between attempts: try again
  next_rand
  victim=$(echo "$ranks" | tr ' ' '\n' | sed -n "$((rand % n + 1))p")
  kill -KILL "$victim" 2>/dev/null || continue
  k=$((k + 1))
  echo "kill $k: pid $victim at step $(tail -n 1 m.jsonl | sed 's/^{"step":\([0-9]*\).*/\1/')"
done
wait "$launcher_pid"
code=$?
launcher_pid=
[ "$code" -eq 0 ] || fail "the job exited with $code"
restarts=$(grep -c "restarting every rank" out)
echo "the job finished after $restarts restarts"
[ "$restarts" -ge "$kills" ] || fail "$restarts restarts for $kills kills"
grep -q "relaunch [0-9]* of $((kills + 5)) (actorpipe-launch --max-restarts) after: rank [0-9] killed by signal 9 (SIGKILL)" out ||
  fail "no relaunch message"
for f in whole/final/*; do
  name=$(basename "$f")
  cmp "$f" "run/final/$name" || fail "run/final/$name differs from the uninterrupted job's"
done
n=$(grep -c '^{"step":' m.jsonl)
[ "$n" -eq "$steps" ] || fail "$n step lines in the metrics, expected $steps (each step once)"
r=$(grep -c '^{"restart":' m.jsonl)
[ "$r" -eq "$restarts" ] || fail "$r restart lines in the metrics for $restarts restarts"
echo "the restarted job equals the uninterrupted one"
