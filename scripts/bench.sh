#!/usr/bin/env bash
# Sets up (with the PyTorch peer), builds actorpipe-bench and runs it with the default
# shapes and thread counts; arguments go to actorpipe-bench (e.g. --json, --profile).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --bench
scripts/build.sh --target actorpipe-bench
load=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load" 'BEGIN { exit !(l >= 0.5) }'; then
  echo "bench: load average $load: other processes are running; the figures will be distorted" >&2
fi
exec "${BUILD_DIR:-build}"/bench/actorpipe-bench "$@"
