#!/usr/bin/env bash
# tests.sanitizers.tsan_filter: tsan_filter.awk forgives a report only when every access in it was
# made by libcaf's code: the innermost frame of each access stack that is not runtime code lies in
# libcaf (runs in every build; the reports are written out here).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0

# expect NAME EXIT-CODE PATTERN: runs the filter on $dir/NAME, checks its exit code and output
expect() {
  local out rc
  out=$(awk -f "$here/tsan_filter.awk" "$dir/$1" 2>&1)
  rc=$?
  if ((rc != $2)) || ! grep -q -- "$3" <<<"$out"; then
    echo "FAIL $1: exit $rc (expected $2), output:"
    echo "$out"
    failures=$((failures + 1))
  else
    echo "ok   $1"
  fi
}

cat >"$dir/caf_only" <<'R'
==================
WARNING: ThreadSanitizer: data race (pid=100)
  Write of size 8 at 0x7b0c00001000 by thread T2:
    #0 memset ../../../../src/libsanitizer/sanitizer_common/sanitizer_common_interceptors.inc:799 (libtsan.so.2+0x6b7c1)
    #1 <null> <null> (libcaf_core.so.0.17.6+0x1a2b3)
    #2 caf::scheduled_actor::resume(caf::execution_unit*, unsigned long) <null> (libcaf_core.so.0.17.6+0x2b3c4)
    #3 <null> <null> (libstdc++.so.6+0xd44a2)

  Previous read of size 8 at 0x7b0c00001000 by thread T1:
    #0 <null> <null> (libcaf_core.so.0.17.6+0x1a2c0)
    #1 <null> <null> (libcaf_core.so.0.17.6+0x2b3c4)

  Location is heap block of size 64 at 0x7b0c00000fc0 allocated by main thread:
    #0 operator new(unsigned long) ../../../../src/libsanitizer/tsan/tsan_new_delete.cpp:64 (libtsan.so.2+0x8e2b3)
    #1 actorpipe::ActorEngine::start() /src/actors/actor_engine.cpp:300 (test_actors_x+0x4567)

  Thread T2 (tid=102, running) created by main thread at:
    #0 pthread_create ../../../../src/libsanitizer/tsan/tsan_interceptors_posix.cpp:1001 (libtsan.so.2+0x5ad75)
    #1 actorpipe::ActorEngine::start() /src/actors/actor_engine.cpp:301 (test_actors_x+0x4568)

SUMMARY: ThreadSanitizer: data race (/lib/x86_64-linux-gnu/libcaf_core.so.0.17.6+0x1a2b3)
==================
R
expect caf_only 0 "forgiven, every access made by libcaf"

# our handler runs on libcaf's scheduler: one frame of ours makes the report ours
sed -e 's|#1 <null> <null> (libcaf_core.so.0.17.6+0x1a2b3)|#1 actorpipe::StageActor::on_forward() /src/actors/stage_actor.cpp:88 (test_actors_x+0x9999)|' \
  "$dir/caf_only" >"$dir/ours_on_caf_stack"
expect ours_on_caf_stack 1 "not libcaf's alone: FAIL"

# libcaf's code on both sides, called from ours (the main thread tearing an actor system down)
# and from a CAF header template compiled into our binary: who called libcaf does not matter
cat >"$dir/caf_called_from_ours" <<'R'
WARNING: ThreadSanitizer: data race (pid=29516)
  Write of size 8 at 0x7b640000bd30 by main thread:
    #0 memset ../../../../src/libsanitizer/sanitizer_common/sanitizer_common_interceptors.inc:799 (libtsan.so.2+0x5cbc4)
    #1 memset ../../../../src/libsanitizer/sanitizer_common/sanitizer_common_interceptors.inc:797 (libtsan.so.2+0x5cbc4)
    #2 std::_Hashtable<caf::group, caf::group>::clear() <null> (libcaf_core.so.0.17.6+0xde7cd)
    #3 actorpipe::ActorEngine::run(int, actorpipe::DataLoader&, actorpipe::ActorCallbacks const&) /src/actors/actor_engine.cpp:1018 (test_actors_x+0x95de5)
    #4 run_engine /src/actors/migration_manager.test.cpp:87 (test_actors_x+0x4cc17)

  Previous write of size 8 at 0x7b640000bd30 by thread T22:
    #0 memset ../../../../src/libsanitizer/sanitizer_common/sanitizer_common_interceptors.inc:799 (libtsan.so.2+0x5cbc4)
    #1 std::_Hashtable<caf::group, caf::group>::clear() /usr/include/c++/12/bits/hashtable.h:2501 (test_actors_x+0xf5d6e)
    #2 caf::mixin::subscriber<caf::event_based_actor>::cleanup(caf::error&&, caf::execution_unit*) /usr/include/caf/mixin/subscriber.hpp:61 (test_actors_x+0xf5d6e)
    #3 <null> <null> (libcaf_core.so.0.17.6+0x1b000)
    #4 actorpipe::StageActor::make_behavior() /src/actors/stage_actor.cpp:60 (test_actors_x+0x1234)

SUMMARY: ThreadSanitizer: data race (/lib/x86_64-linux-gnu/libcaf_core.so.0.17.6+0xde7cd)
R
expect caf_called_from_ours 0 "forgiven, every access made by libcaf"

# the standard library's templates are passed over to the code that called them: ours
sed -e 's|#2 caf::mixin::subscriber<caf::event_based_actor>::cleanup(caf::error&&, caf::execution_unit\*) /usr/include/caf/mixin/subscriber.hpp:61|#2 actorpipe::StageWorker::exec_forward() /src/engine/execution/stage_worker.cpp:300|' \
  "$dir/caf_called_from_ours" >"$dir/ours_through_std"
expect ours_through_std 1 "not libcaf's alone: FAIL"

# UCX is not libcaf: not forgiven
sed -e 's|(libcaf_core.so.0.17.6+0x1a2c0)|(libucs.so.0+0x1a2c0)|' "$dir/caf_only" >"$dir/ucx_frame"
expect ucx_frame 1 "not libcaf's alone: FAIL"

# only neutral frames: nothing shows the report is libcaf's
cat >"$dir/neutral_only" <<'R'
WARNING: ThreadSanitizer: data race (pid=101)
  Write of size 8 at 0x7b0c00001000 by thread T2:
    #0 memset <null> (libtsan.so.2+0x6b7c1)
    #1 <null> <null> (libc.so.6+0x1234)

  Previous write of size 8 at 0x7b0c00001000 by thread T1:
    #0 <null> <null> (libstdc++.so.6+0x1a2c0)

SUMMARY: ThreadSanitizer: data race (libc.so.6+0x1234)
R
expect neutral_only 1 "not libcaf's alone: FAIL"

# a thread leak has only a context stack: it judges, and our frame in it makes the report ours
cat >"$dir/thread_leak" <<'R'
WARNING: ThreadSanitizer: thread leak (pid=103)
  Thread T1 (tid=104, finished) created by main thread at:
    #0 pthread_create <null> (libtsan.so.2+0x5ad75)
    #1 actorpipe::UcxWorker::start() /src/transport/ucx_worker.cpp:50 (test_transport_x+0x10)

SUMMARY: ThreadSanitizer: thread leak /src/transport/ucx_worker.cpp:50 in actorpipe::UcxWorker::start()
R
expect thread_leak 1 "not libcaf's alone: FAIL"

# two files: one forgiven, one ours, counted separately; a report cut short (no SUMMARY) still counts
head -n 8 "$dir/caf_only" >"$dir/cut_short"
expect cut_short 0 "1 report(s) forgiven"
out=$(awk -f "$here/tsan_filter.awk" "$dir/caf_only" "$dir/ucx_frame" 2>&1)
if ! grep -q "1 report(s) forgiven (libcaf only), 1 report(s) ours" <<<"$out"; then
  echo "FAIL two files: $out"
  failures=$((failures + 1))
else
  echo "ok   two files"
fi

# TSan's own fatal errors fail the run
printf 'FATAL: ThreadSanitizer: unexpected memory mapping 0x1000-0x2000\n' >"$dir/fatal"
expect fatal 1 "FATAL"

((failures == 0)) || { echo "$failures case(s) failed"; exit 1; }
