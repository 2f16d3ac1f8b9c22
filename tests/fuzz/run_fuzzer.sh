#!/usr/bin/env bash
# Runs one libFuzzer harness for a bounded time on a scratch copy of its seed corpus (the
# repository is never written). Fails on a crash, a hang (an input slower than 10 s), a leak,
# more than 2 GiB of memory or any sanitizer report; the input that failed is kept in
# <work>/artifacts/. Writes a one-line summary to <work>/summary.
#   run_fuzzer.sh <harness> <seed corpus> <work directory> <seconds>
set -euo pipefail
harness=$1 seeds=$2 work=$3 seconds=$4
name=$(basename "$harness")
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
cp "$seeds"/* "$work/corpus/"
seeds_n=$(find "$work/corpus" -type f | wc -l)
status=0
"$harness" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" "$work/corpus" >"$work/log" 2>&1 || status=$?
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n 1)
grown=$(find "$work/corpus" -type f | wc -l)
echo "$name: ${runs:-?} runs in $seconds s, corpus $seeds_n -> $grown inputs, exit $status" \
  | tee "$work/summary"
if [[ $status -ne 0 ]]; then
  tail -n 80 "$work/log"
  ls -l "$work/artifacts"
  exit "$status"
fi
