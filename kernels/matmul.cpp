// Linear layer through gemm(): the bias is written into the output first and the GEMM
// accumulates onto it (no extra pass); dbias sums rows in order per column slice.
#include "kernels/matmul.hpp"

#include "kernels/gemm.hpp"

namespace actorpipe {

void matmul_forward(Context& ctx, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC) {
  if (bias != nullptr) {
    ctx.parallel_for(N, [&](int, int64_t r0, int64_t r1) {
      const float* __restrict b = bias;
      for (int64_t r = r0; r < r1; ++r) {
        float* __restrict o = out + r * OC;
        for (int k = 0; k < OC; ++k) o[k] = b[k];
      }
    });
  }
  gemm(ctx, false, true, N, OC, C, 1.0f, inp, C, weight, C, bias != nullptr ? 1.0f : 0.0f, out, OC);
}

void matmul_backward(Context& ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC) {
  if (dinp != nullptr) gemm(ctx, false, false, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
  gemm(ctx, true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias != nullptr) {
    ctx.parallel_for_aligned(OC, 16, [&](int, int64_t o0, int64_t o1) {
      if (o0 == o1) return;
      const int64_t w = o1 - o0;
      float* __restrict db = dbias + o0;
      for (int64_t r = 0; r < N; ++r) {
        const float* __restrict g = dout + r * OC + o0;
        for (int64_t k = 0; k < w; ++k) db[k] += g[k];
      }
    });
  }
}

}  // namespace actorpipe
