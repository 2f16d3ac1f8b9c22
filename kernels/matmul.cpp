// Linear layer through gemm(): the bias is written into the output first and the GEMM
// accumulates onto it (no extra pass); dbias sums rows in order per column slice.
#include "kernels/matmul.hpp"

#include "kernels/gemm.hpp"

namespace actorpipe {

namespace {
void copy_row(float* __restrict o, const float* __restrict b, const int n) {
  for (int k = 0; k < n; ++k) o[k] = b[k];
}
void add_row(float* __restrict acc, const float* __restrict g, const int64_t n) {
  for (int64_t k = 0; k < n; ++k) acc[k] += g[k];
}
}  // namespace

void matmul_forward(Context& ctx, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC) {
  if (bias != nullptr) {
    ctx.parallel_for(N, [&](int, int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) copy_row(out + r * OC, bias, OC);
    });
  }
  gemm(ctx, false, true, N, OC, C, 1.0f, inp, C, weight, C, bias != nullptr ? 1.0f : 0.0f, out, OC);
}

void matmul_backward(Context& ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC) {
  if (dinp != nullptr) matmul_backward_input(ctx, dinp, dout, weight, N, C, OC);
  matmul_backward_weight(ctx, dweight, dbias, dout, inp, N, C, OC);
}

void matmul_backward_input(Context& ctx, float* dinp, const float* dout, const float* weight, int N,
                           int C, int OC) {
  gemm(ctx, false, false, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
}

void matmul_backward_weight(Context& ctx, float* dweight, float* dbias, const float* dout,
                            const float* inp, int N, int C, int OC) {
  gemm(ctx, true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias != nullptr) {
    ctx.parallel_for_aligned(OC, 16, [&](int, int64_t o0, int64_t o1) {
      if (o0 == o1) return;
      for (int64_t r = 0; r < N; ++r) add_row(dbias + o0, dout + r * OC + o0, o1 - o0);
    });
  }
}

}  // namespace actorpipe
