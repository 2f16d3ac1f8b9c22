#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite; prints ctest's summary.
#   1. Release build (-Werror under CI), every test.
#   2. AddressSanitizer + UndefinedBehaviorSanitizer build, every test except the slow label.
#   3. ThreadSanitizer build of the kernels, engine, transport and actors tests, and those tests
#      (scripts/tsan.sh).
#   4. The libFuzzer harnesses (clang), each run for 20 s on its seed corpus (scripts/fuzz.sh).
# ACTORPIPE_TEST_SANITIZE=0 skips step 2, ACTORPIPE_TEST_TSAN=0 step 3, ACTORPIPE_TEST_FUZZ=0
# step 4; extra arguments go to the ctest runs of steps 1 and 2.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-$(nproc)}
# each step's wall time, printed as it ends and again at the end (where the suite's time goes)
times=()
t0=$(date +%s)
step_done() {
  local now
  now=$(date +%s)
  times+=("$1 $((now - t0)) s")
  echo "== $1: $((now - t0)) s"
  t0=$now
}
scripts/setup.sh
step_done "setup"

echo "== release build and tests"
BUILD_DIR=${BUILD_DIR:-build} scripts/build.sh
step_done "release build"
(cd "${BUILD_DIR:-build}" && ctest -j "$jobs" --output-on-failure --timeout 600 "$@")
step_done "release tests"

if [[ "${ACTORPIPE_TEST_SANITIZE:-1}" != "0" ]]; then
  echo "== address,undefined sanitizer build and tests"
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  BUILD_DIR=build-asan BUILD_TYPE=RelWithDebInfo \
    CMAKE_ARGS="-DACTORPIPE_SANITIZE=address,undefined -DACTORPIPE_BENCH=OFF -DACTORPIPE_CUDA=OFF" \
    scripts/build.sh
  step_done "address,undefined build"
  (cd build-asan && ctest -j "$jobs" --output-on-failure --timeout 900 -LE slow "$@")
  step_done "address,undefined tests"
fi

if [[ "${ACTORPIPE_TEST_TSAN:-1}" != "0" ]]; then
  echo "== thread sanitizer build and tests (kernels, engine, transport, actors)"
  BUILD_DIR=build-tsan scripts/tsan.sh
  step_done "thread sanitizer build and tests"
fi

if [[ "${ACTORPIPE_TEST_FUZZ:-1}" != "0" ]]; then
  echo "== libFuzzer harnesses, ${FUZZ_SECONDS:-20} s each"
  BUILD_DIR=build-fuzz scripts/fuzz.sh
  step_done "fuzz build and runs"
fi
echo "== where the time went:"
printf '   %s\n' "${times[@]}"
