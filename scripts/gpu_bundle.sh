#!/usr/bin/env bash
# Builds the GPU checks into a folder that runs on a GPU machine whose system lacks the Debian
# libraries the engine links (a CUDA container, say): the parity suite, the model step test, the
# backend trainer test and actorpipe-bench-device, built for any x86-64 (ACTORPIPE_NATIVE=OFF),
# with the shared libraries they need besides glibc, libstdc++ and CUDA's packed as libs.tar.xz,
# and run.sh, which runs them all there (docs/gpu.md, "Running on a GPU machine").
# Usage: scripts/gpu_bundle.sh [OUT_DIR]   (default: gpu-bundle; the build goes to build-gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-bundle}
build=${BUILD_DIR:-build-gpu}
command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
  { echo "gpu_bundle: no nvcc (install the CUDA toolkit): the CUDA backend cannot be built" >&2; exit 1; }
scripts/setup.sh
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACTORPIPE_NATIVE=OFF \
  -DACTORPIPE_CUDA=ON >/dev/null
programs=(test_kernels_cuda_backend test_tests_cuda_model_step test_engine_execution_backend_trainer
  actorpipe-bench-device)
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target "${programs[@]}"
rm -rf "$out" && mkdir -p "$out/bin"
for p in "${programs[@]}"; do cp "$(find "$build" -name "$p" -type f -perm -u+x | head -1)" "$out/bin/"; done
# every library the programs load except the C and C++ runtimes and CUDA's own (the GPU machine's
# driver and toolkit provide those, matching each other)
libs=$(ldd "$out"/bin/* | awk '/=>/ { print $3 }' | sort -u |
  grep -v -E '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|libcuda|libcublas|libcudart|libnccl' || true)
stage=$(mktemp -d)
for l in $libs; do cp -L "$l" "$stage/"; done
tar cJf "$out/libs.tar.xz" -C "$stage" .
rm -rf "$stage"
cat >"$out/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs the GPU checks of this bundle; results also go to ${OUT:-./results}. Exits non-zero when
# any check fails (without a usable GPU the tests report themselves skipped and the bench fails).
set -u -o pipefail
cd "$(dirname "$0")"
results=${OUT:-$PWD/results}
mkdir -p "$results" /tmp/actorpipe-libs
tar xJf libs.tar.xz -C /tmp/actorpipe-libs
# CUDA's runtime, cuBLAS and NCCL from wherever this machine keeps them
for n in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  p=$(find /usr/local /opt /usr/lib -name "$n" 2>/dev/null | head -1)
  echo "$n -> ${p:-not found}"
  [[ -n "$p" ]] && ln -sf "$p" "/tmp/actorpipe-libs/$n"
done
export LD_LIBRARY_PATH=/tmp/actorpipe-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} OPENBLAS_NUM_THREADS=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
status=0
for t in test_kernels_cuda_backend test_tests_cuda_model_step test_engine_execution_backend_trainer; do
  echo "== $t"
  timeout 600 "bin/$t" 2>&1 | tee "$results/$t.txt" | tail -8 || status=1
done
echo "== actorpipe-bench-device"
for s in small gpt2; do
  for p in fp32 bf16; do
    timeout 300 bin/actorpipe-bench-device --backend cuda --shape "$s" --precision "$p" \
      --reps 20 --warmup 3 --profile 2>&1 | tee -a "$results/bench.txt" || status=1
  done
done
exit "$status"
EOF
chmod +x "$out/run.sh"
echo "gpu_bundle: $out ($(du -sh "$out" | cut -f1)): copy it to the GPU machine and run $out/run.sh"
