#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite; prints ctest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest -j "${JOBS:-$(nproc)}" --output-on-failure --timeout 600 "$@"
