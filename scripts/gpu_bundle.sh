#!/usr/bin/env bash
# Builds the GPU checks into a folder that runs on a GPU machine whose system lacks the Debian
# libraries the engine links (a CUDA container, say), built for any x86-64
# (ACTORPIPE_NATIVE=OFF): the GPU tests (the parity suite, the model step, the pipeline and the
# Trainer on GPUs, the device tests), actorpipe-bench-device, actorpipe-gpt and actorpipe-launch,
# stripped, with the shared libraries they need besides glibc, libstdc++ and CUDA's packed as
# libs.tar.xz, the multi-process oracle's CMake scripts, and run.sh, which runs every check there
# (docs/gpu.md, "Running on a GPU machine").
# With CPU_MARCH set (e.g. sapphirerapids, for a GPU machine's Xeon host) it also builds
# actorpipe-bench for that CPU (-march=$CPU_MARCH, in build-$CPU_MARCH) as bin/actorpipe-bench-cpu
# with the PyTorch peer's script, and run.sh times the CPU step there too (docs/benchmarks.md,
# "bf16 on a Xeon with AMX").
# Usage: [CPU_MARCH=...] scripts/gpu_bundle.sh [OUT_DIR]   (default: gpu-bundle; the build goes
# to build-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-bundle}
build=${BUILD_DIR:-build-gpu}
command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
  { echo "gpu_bundle: no nvcc (install the CUDA toolkit): the CUDA backend cannot be built" >&2; exit 1; }
scripts/setup.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACTORPIPE_NATIVE=OFF \
  -DACTORPIPE_CUDA=ON >/dev/null
tests=(test_kernels_cuda_backend test_kernels_device test_tests_cuda_model_step
  test_tests_cuda_pipeline test_tests_cuda_trainer test_engine_execution_backend_trainer
  test_engine_devices_stage_devices test_actors_trainer_device test_transport_nccl_channel
  test_tests_cuda_nccl_channel)
# nccl_channel_peer: the NCCL channel test's second process, found next to the test
programs=("${tests[@]}" nccl_channel_peer actorpipe-bench-device actorpipe-gpt actorpipe-launch)
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target "${programs[@]}"
rm -rf "$out" && mkdir -p "$out/bin" "$out/multiprocess"
for p in "${programs[@]}"; do
  cp "$(find "$build" -name "$p" -type f -perm -u+x | head -1)" "$out/bin/"
  strip "$out/bin/$p"
done
echo "${tests[*]}" >"$out/tests.txt"
if [[ -n ${CPU_MARCH:-} ]]; then
  cpu_build=build-$CPU_MARCH
  cmake -S . -B "$cpu_build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACTORPIPE_NATIVE=OFF \
    "-DCMAKE_CXX_FLAGS=-march=$CPU_MARCH" -DACTORPIPE_CUDA=OFF -DACTORPIPE_TESTS=OFF >/dev/null
  cmake --build "$cpu_build" -j "${JOBS:-$(nproc)}" --target actorpipe-bench
  cp "$cpu_build/bench/actorpipe-bench" "$out/bin/actorpipe-bench-cpu"
  strip "$out/bin/actorpipe-bench-cpu"
  mkdir -p "$out/peers" && cp bench/peers/*.py "$out/peers/"
  echo "$CPU_MARCH" >"$out/cpu_march.txt"
fi
cp tests/multiprocess/same_bits.cmake tests/multiprocess/compare_runs.cmake \
  tests/multiprocess/kill_restart.sh "$out/multiprocess/"
# every library the programs load except the C and C++ runtimes and CUDA's own (the GPU machine's
# driver and toolkit provide those, matching each other)
libs=$(ldd "$out"/bin/* | awk '/=>/ { print $3 }' | sort -u |
  grep -v -E '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|libcuda|libcublas|libcudart|libnccl' || true)
stage=$(mktemp -d)
for l in $libs; do cp -L "$l" "$stage/"; done
tar cJf "$out/libs.tar.xz" -C "$stage" .
rm -rf "$stage"
cp scripts/gpu_run.sh "$out/run.sh"
chmod +x "$out/run.sh"
echo "gpu_bundle: $out ($(du -sh "$out" | cut -f1)): copy it to the GPU machine and run $out/run.sh"
