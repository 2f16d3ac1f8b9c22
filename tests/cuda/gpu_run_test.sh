#!/usr/bin/env bash
# tests.cuda.gpu_run_checked: scripts/gpu_run.sh (the GPU bundle's run.sh) over a bundle of this
# build's programs, with DEVICE=checked, so the checks a GPU session runs (the trainer against the
# CPU, 2 processes against 1, sampling, the memory check) stay runnable between GPU sessions.
# Usage: gpu_run_test.sh RUN_SH GPT LAUNCH MULTIPROCESS_DIR TEST_PROGRAM...
set -euo pipefail
run_sh=$1 gpt=$2 launch=$3 mp=$4
shift 4
bundle=$(mktemp -d)
trap 'rm -rf "$bundle"' EXIT
mkdir -p "$bundle/bin" "$bundle/multiprocess"
ln -s "$gpt" "$bundle/bin/actorpipe-gpt"
ln -s "$launch" "$bundle/bin/actorpipe-launch"
for t in "$@"; do
  ln -s "$t" "$bundle/bin/$(basename "$t")"
  basename "$t" >>"$bundle/tests.txt"
done
cp "$mp/same_bits.cmake" "$mp/compare_runs.cmake" "$bundle/multiprocess/"
tar cJf "$bundle/libs.tar.xz" -T /dev/null
cp "$run_sh" "$bundle/run.sh"
status=0
DEVICE=checked BUDGET=600 OUT="$bundle/results" "$bundle/run.sh" || status=$?
cat "$bundle/results/summary.txt"
if ((status != 0)); then
  cat "$bundle/results/log.txt"
  exit "$status"
fi
# every check ran, or was left out only for needing a GPU
! grep -v -E " passed| not run \(DEVICE=checked: needs a GPU\)|^status 0 " "$bundle/results/summary.txt"
