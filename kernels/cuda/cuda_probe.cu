// CUDA probe and self-test: device count and versions without touching a device when there is
// none; with a GPU, a saxpy kernel and a cuBLAS sgemm checked against the CPU.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/cuda/cuda_probe.h"

namespace {

__global__ void saxpy(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

int usable_gpus(char* why, int capacity) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    std::snprintf(why, static_cast<size_t>(capacity), "cudaGetDeviceCount: %s (%d)",
                  cudaGetErrorString(e), static_cast<int>(e));
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  if (n == 0) std::snprintf(why, static_cast<size_t>(capacity), "no CUDA device present");
  return n;
}

}  // namespace

extern "C" void ap_cuda_probe(ap_cuda_probe_result* out) {
  std::memset(out, 0, sizeof *out);
  cudaRuntimeGetVersion(&out->runtime_version);
  cudaDriverGetVersion(&out->driver_version);
  ncclGetVersion(&out->nccl_version);
  out->devices = usable_gpus(out->error, sizeof out->error);
}

extern "C" void ap_cuda_self_test(char* msg, int capacity) {
  auto say = [&](const char* text) {
    std::snprintf(msg, static_cast<size_t>(capacity), "%s", text);
  };
  char why[160] = {0};
  if (usable_gpus(why, sizeof why) == 0) {
    std::snprintf(msg, static_cast<size_t>(capacity), "no usable GPU: %s", why);
    return;
  }
  const int n = 64;  // saxpy on n elements, then an n x n x n sgemm
  std::vector<float> x(n * n), y(n * n), c(n * n, 0.f), ref(n * n, 0.f);
  for (int i = 0; i < n * n; ++i) {
    x[i] = static_cast<float>((i * 7) % 13) / 13.f;
    y[i] = static_cast<float>((i * 5) % 11) / 11.f;
  }
  float *dx = nullptr, *dy = nullptr, *dc = nullptr;
  size_t bytes = sizeof(float) * n * n;
  if (cudaMalloc(&dx, bytes) != cudaSuccess || cudaMalloc(&dy, bytes) != cudaSuccess ||
      cudaMalloc(&dc, bytes) != cudaSuccess) {
    say("cudaMalloc failed");
    cudaFree(dx), cudaFree(dy), cudaFree(dc);
    return;
  }
  cudaMemcpy(dx, x.data(), bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(dy, y.data(), bytes, cudaMemcpyHostToDevice);
  saxpy<<<(n * n + 255) / 256, 256>>>(n * n, 2.f, dx, dy);
  std::vector<float> y2(n * n);
  cudaMemcpy(y2.data(), dy, bytes, cudaMemcpyDeviceToHost);
  for (int i = 0; i < n * n && msg[0] == 0; ++i)
    if (std::fabs(y2[i] - (2.f * x[i] + y[i])) > 1e-6f)
      say("saxpy kernel result differs from the CPU");
  cublasHandle_t h = nullptr;
  if (msg[0] == 0 && cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) say("cublasCreate failed");
  if (msg[0] == 0) {
    const float one = 1.f, zero = 0.f;  // column-major: C = X * Y
    cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, dx, n, dy, n, &zero, dc, n);
    cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost);
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < n; ++i) {
        double s = 0;
        for (int k = 0; k < n; ++k) s += double(x[k * n + i]) * double(y2[j * n + k]);
        ref[j * n + i] = static_cast<float>(s);
      }
    for (int i = 0; i < n * n && msg[0] == 0; ++i)
      if (std::fabs(c[i] - ref[i]) > 1e-3f * (1.f + std::fabs(ref[i])))
        say("cuBLAS sgemm differs from the CPU");
  }
  if (h) cublasDestroy(h);
  cudaFree(dx), cudaFree(dy), cudaFree(dc);
}
