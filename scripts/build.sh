#!/usr/bin/env bash
# Configures and builds actorpipe into ${BUILD_DIR:-build} (Release; -Werror under CI). A unity
# build unless UNITY_BUILD=OFF: each library's sources compile in batches of 8, which takes a
# quarter off a whole build's CPU time (docs/testing.md, "Where the time goes"); an edited source
# recompiles its batch. The tests' common headers (doctest, fmt, the standard library) are
# precompiled once unless TEST_PCH=OFF (ACTORPIPE_TEST_PCH).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
werror=OFF
[[ "${CI:-}" == "true" ]] && werror=ON
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} \
  -DACTORPIPE_WERROR=${ACTORPIPE_WERROR:-$werror} -DCMAKE_UNITY_BUILD=${UNITY_BUILD:-ON} \
  -DACTORPIPE_TEST_PCH=${TEST_PCH:-ON} \
  ${CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc)}" "$@"
