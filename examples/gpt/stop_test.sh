#!/bin/sh
# SIGINT / SIGTERM stop a training gracefully, and its checkpoint resumes to the uninterrupted
# bits: trains a reference run of STEPS steps; starts the same training, sends SIG once its first
# step is in the metrics, and checks the exit code (128 + SIG), the message, the checkpoint and
# the metrics' "stopped" line; resumes it to STEPS and compares the final checkpoints' bytes.
# pipedream and xpipe (train.stop = "step", the default) stop after the step in flight too, in
# the middle of their one run (no periodic checkpoints here), and drain there: the reference is
# then a training of as many steps resumed to STEPS, made after the stop.
# PROCS > 1 runs every training under actorpipe-launch (the signal goes to the launcher).
# usage: sh stop_test.sh GPT LAUNCHER WORKDIR SIG MODE PROCS [KEY=VALUE]  (one more --set)
gpt=$1
launcher=$2
dir=$3
sig=$4
mode=$5
procs=$6
extra=${7:-}
steps=40
every=10
drains=
case $mode in pipedream | xpipe) drains=1 every=0 ;; esac
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 1

exec_run=
# runs the training (under the launcher when procs > 1) with the extra --set arguments; with
# exec_run set, the calling shell becomes it
run() {
  set -- --set pipeline.mode="$mode" --set train.steps=$steps --set checkpoint.every=$every \
    --set train.log_every=20 "$@"
  if [ -n "$extra" ]; then set -- "$@" --set "$extra"; fi
  if [ "$procs" -gt 1 ]; then set -- "$launcher" -n "$procs" -- "$gpt" "$@"; else set -- "$gpt" "$@"; fi
  if [ -n "$exec_run" ]; then exec "$@"; fi
  "$@"
}
fail() {
  echo "FAILED: $1"
  [ -f out ] && { echo "--- output of the stopped run"; cat out; }
  exit 1
}

if [ -z "$drains" ]; then
  run --set checkpoint.dir=whole >whole.out 2>&1 || { cat whole.out; fail "the reference run"; }
fi

# in a subshell that becomes the program (exec), so that $! is the process the signal is for
(
  exec_run=1
  run --set checkpoint.dir=run --set train.metrics=m.jsonl
) >out 2>&1 &
pid=$!
i=0
while ! grep -q '^{"step":' m.jsonl 2>/dev/null; do
  i=$((i + 1))
  if [ $i -gt 1200 ]; then
    kill -KILL "$pid" 2>/dev/null
    fail "no step in 60 s"
  fi
  sleep 0.05
done
kill -"$sig" "$pid"
wait "$pid"
code=$?
cat out
case $sig in INT) want=130 ;; TERM) want=143 ;; *) fail "unknown signal $sig" ;; esac
[ "$code" -eq "$want" ] || fail "exit code $code, expected $want"
line=$(grep -o "stopped by SIG$sig after step [0-9]* of $steps; checkpoint run/step-[0-9]*; resume with --set checkpoint.resume=run; metrics m.jsonl" out | head -n 1)
[ -n "$line" ] || fail "no 'stopped by SIG$sig ...' message"
at=$(echo "$line" | sed 's/.*after step \([0-9]*\) of.*/\1/')
echo "$line" | grep -q "checkpoint run/step-$at;" || fail "the checkpoint is not the step it stopped at"
[ "$at" -lt "$steps" ] || fail "it stopped only at the end"
[ -f "run/step-$at/manifest.json" ] || fail "run/step-$at was not written"
[ ! -e run/final ] || fail "a stopped run wrote run/final"
tail -n 1 m.jsonl | grep -q "^{\"stopped\":{\"step\":$at,\"signal\":\"SIG$sig\",\"checkpoint\":\"run/step-$at\"}}\$" ||
  fail "the metrics do not end with the stop: $(tail -n 1 m.jsonl)"
echo "stopped after step $at"

run --set checkpoint.dir=run --set checkpoint.resume=run --set train.metrics=m.jsonl \
  >resumed.out 2>&1 || { cat resumed.out; fail "the resumed run"; }
grep -q "resumed from run/step-$at at step $at" resumed.out || { cat resumed.out; fail "no resume message"; }
if [ -n "$drains" ]; then
  # the same boundary without a signal: a training of $at steps, resumed to $steps
  run --set checkpoint.dir=whole --set train.steps="$at" >whole.out 2>&1 ||
    { cat whole.out; fail "the reference's first $at steps"; }
  run --set checkpoint.dir=whole --set checkpoint.resume=whole >>whole.out 2>&1 ||
    { cat whole.out; fail "the reference's resume"; }
fi
for f in whole/final/*; do
  name=$(basename "$f")
  cmp "$f" "run/final/$name" || fail "run/final/$name differs from the reference run's"
done
n=$(grep -c '^{"step":' m.jsonl)
[ "$n" -eq "$steps" ] || fail "$n step lines in the metrics, expected $steps (each step once)"
if [ -n "$drains" ]; then
  echo "the resumed training equals one whose run ended at step $at"
else
  echo "the resumed training equals the uninterrupted one"
fi
