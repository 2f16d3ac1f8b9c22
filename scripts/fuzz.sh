#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz (clang, ACTORPIPE_FUZZ=ON) into
# ${BUILD_DIR:-build-fuzz}: only they and the sources they fuzz. Then runs each for
# ${FUZZ_SECONDS:-20} s on a scratch copy of its seed corpus (the ctest tests labelled fuzz) and
# prints ctest's summary, each harness's executions and the time of the build and of the runs.
# Fails on any crash, hang, leak, running out of memory or sanitizer report; ctest then shows
# the harness's log and where it kept the input. Extra arguments go to ctest (-R fuzz.config).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-fuzz}
jobs=${JOBS:-$(nproc)}
werror=OFF
[[ "${CI:-}" == "true" ]] && werror=ON

start=$(date +%s)
# Debug: no NDEBUG, so the assertions of toml11 and nlohmann-json stay on; the fuzz flags set -O1
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DACTORPIPE_FUZZ=ON \
  -DACTORPIPE_FUZZ_SECONDS="${FUZZ_SECONDS:-20}" -DACTORPIPE_TESTS=OFF -DACTORPIPE_BENCH=OFF \
  -DACTORPIPE_CUDA=OFF -DACTORPIPE_WERROR="${ACTORPIPE_WERROR:-$werror}" >/dev/null
cmake --build "$build" -j "$jobs" --target actorpipe_fuzzers
built=$(date +%s)

status=0
(cd "$build" && ctest -L fuzz -j "$jobs" --output-on-failure "$@") || status=$?
end=$(date +%s)
cat "$build"/tests/fuzz/runs/*/summary 2>/dev/null || true
echo "fuzz: build $((built - start)) s, runs $((end - built)) s"
exit "$status"
