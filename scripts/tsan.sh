#!/usr/bin/env bash
# Builds the tests of kernels/, engine/, transport/ and actors/ with ThreadSanitizer into
# ${BUILD_DIR:-build-tsan} (only they: target actorpipe_tsan_tests) and runs them (labels
# kernels, engine, transport, actors, sanitizers; not the slow label). Every test executable runs
# through tests/sanitizers/tsan_run.sh: a TSan report fails its test unless every frame of its
# accesses lies in libcaf, and libcaf's own orderings are told to TSan by a preloaded library
# (docs/testing.md, "ThreadSanitizer"). Prints ctest's summary and the time of the build and of
# the runs. A unity build unless UNITY_BUILD=OFF, the tests' headers precompiled unless
# TEST_PCH=OFF (scripts/build.sh). Extra arguments go to ctest
# (-R actors.driver).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-tsan}
jobs=${JOBS:-$(nproc)}
werror=OFF
[[ "${CI:-}" == "true" ]] && werror=ON

start=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DACTORPIPE_SANITIZE=thread \
  -DACTORPIPE_BENCH=OFF -DACTORPIPE_CUDA=OFF -DACTORPIPE_WERROR="${ACTORPIPE_WERROR:-$werror}" \
  -DCMAKE_UNITY_BUILD="${UNITY_BUILD:-ON}" -DACTORPIPE_TEST_PCH="${TEST_PCH:-ON}" >/dev/null
cmake --build "$build" -j "$jobs" --target actorpipe_tsan_tests
built=$(date +%s)

status=0
(cd "$build" && ctest -j "$jobs" --output-on-failure --timeout 900 \
  -L '^(kernels|engine|transport|actors|sanitizers)$' -LE slow "$@") || status=$?
end=$(date +%s)
echo "tsan: build $((built - start)) s, runs $((end - built)) s"
exit "$status"
