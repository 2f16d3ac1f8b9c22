#!/usr/bin/env bash
# Sets up, builds and trains the example GPT on the built-in synthetic corpus (about a minute).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec "${BUILD_DIR:-build}"/examples/gpt/actorpipe-gpt "$@"
