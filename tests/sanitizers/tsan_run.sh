#!/usr/bin/env bash
# Runs one test command of a ThreadSanitizer build (ACTORPIPE_SANITIZE=thread) and judges the
# reports it wrote: every test executable runs through this script (its CROSSCOMPILING_EMULATOR).
#
#   tsan_run.sh [--preload LIB] COMMAND [ARGS...]
#
# --preload LIB: LD_PRELOAD it (caf_happens_before.cpp: libcaf's orderings, annotated for TSan);
# the processes the command starts inherit it.
#
# libcaf from Debian is not instrumented, so TSan sees only part of what CAF's own code does.
# A report is forgiven only when every access in it was made by libcaf's code: in each access
# stack, the innermost frame that is not runtime code lies inside libcaf (tsan_filter.awk says
# exactly what counts); any other report fails the test, even when the command itself passed.
# TSan's own suppression files cannot say that: a `race:libcaf` line forgives a report if *any*
# frame matches, and every actor's code runs on a stack that ends in libcaf's scheduler, so it
# would hide every race in our actors too (tests.sanitizers.racy_actor shows this filter still
# catches one).
set -uo pipefail
if [[ "${1:-}" == "--preload" ]]; then
  export LD_PRELOAD="$2${LD_PRELOAD:+:$LD_PRELOAD}"
  shift 2
fi
here=$(cd "$(dirname "$0")" && pwd)
logs=$(mktemp -d "${TMPDIR:-/tmp}/actorpipe-tsan.XXXXXX")
trap 'rm -rf "$logs"' EXIT
# libucm (UCX) hooks madvise; glibc calls it from a thread that is exiting, after TSan has torn
# down that thread's state, and the interceptor crashes. UCX then runs without memory events
# (no registration cache: shared memory and TCP do not need one).
export UCX_MEM_EVENTS=no
# TSan does not intercept shmat: a System V segment UCX maps where a finished thread's stack
# used to be keeps that thread's shadow, and UCX's first copy into it reads as a race with the
# dead thread (seen in transport.ucx_messenger). Shared memory goes through POSIX segments
# (mmap, intercepted: the shadow is reset) unless the command chose transports itself.
export UCX_TLS="${UCX_TLS:-^sysv}"
# Reports go to files (one per process, children included), never change the exit code, and
# do not stop the run: the filter below decides.
export TSAN_OPTIONS="${TSAN_OPTIONS:-} log_path=$logs/report exitcode=0 halt_on_error=0 second_deadlock_stack=1"
"$@"
rc=$?
shopt -s nullglob
reports=("$logs"/report.*)
if ((${#reports[@]} > 0)); then
  if ! awk -f "$here/tsan_filter.awk" "${reports[@]}" >&2; then
    ((rc == 0)) && rc=66
  fi
fi
exit "$rc"
