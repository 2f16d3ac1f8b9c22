#!/usr/bin/env bash
# Installs the Debian packages actorpipe builds against (idempotent).
#   scripts/setup.sh           build and test dependencies
#   scripts/setup.sh --bench   also the benchmark peer (python3-torch, large)
#   scripts/setup.sh --realtext  also the real-text benchmark's plotting (gnuplot-nox, python3;
#                              scripts/realtext.sh; its corpus, fortunes, is a test dependency)
set -euo pipefail

# clang and libclang-rt-14-dev (libFuzzer and the sanitizer runtimes, only recommended by clang):
# the fuzz harnesses of scripts/fuzz.sh; libdnnl-dev: the bf16 matrix products (pipeline.precision);
# lld: the linker (ACTORPIPE_LINKER, 4x faster than GNU ld at the tests' executables)
pkgs=(cmake g++ ninja-build pkg-config clang-format clang libclang-rt-14-dev
      libcaf-dev libucx-dev ucx-utils libfmt-dev doctest-dev libopenblas-dev
      libtoml11-dev nlohmann-json3-dev libgloo-dev libssl-dev openssl openmpi-bin iproute2
      fortunes libdnnl-dev lld)
if [[ "${1:-}" == "--bench" ]]; then
  pkgs+=(python3 python3-torch python3-numpy)
elif [[ "${1:-}" == "--realtext" ]]; then
  pkgs+=(python3 gnuplot-nox)
fi

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#pkgs[@]} Debian packages already installed"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "setup: need root to install ${missing[*]} (run as root, or install them with apt-get yourself)" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get update -qq -o DPkg::Lock::Timeout=600; then
  echo "setup: 'apt-get update' failed: is the Debian mirror reachable (network, proxy)?" >&2
  exit 1
fi
if ! $SUDO apt-get install -y -q -o DPkg::Lock::Timeout=600 "${missing[@]}"; then
  echo "setup: 'apt-get install ${missing[*]}' failed (see above); this needs Debian bookworm's packages" >&2
  exit 1
fi
echo "setup: done"
