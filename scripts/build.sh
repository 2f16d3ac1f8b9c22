#!/usr/bin/env bash
# Configures and builds actorpipe into ${BUILD_DIR:-build} (Release; -Werror under CI).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
werror=OFF
[[ "${CI:-}" == "true" ]] && werror=ON
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} \
  -DACTORPIPE_WERROR=${ACTORPIPE_WERROR:-$werror} ${CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc)}" "$@"
