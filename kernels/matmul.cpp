// Linear layer through gemm(), or in bf16 through gemm_bf16() on bf16 copies of its operands:
// the bias is written into the output first and the GEMM accumulates onto it (no extra pass);
// dbias sums rows in order per column slice (f32 either way; in bf16 in the pass that makes
// dout's bf16 copy).
#include "kernels/matmul.hpp"

#include "kernels/bf16.hpp"
#include "kernels/bf16_gemm.hpp"
#include "kernels/bf16_weights.hpp"
#include "kernels/check.hpp"
#include "kernels/gemm.hpp"

namespace actorpipe {

namespace {
void copy_row(float* __restrict o, const float* __restrict b, const int n) {
  for (int k = 0; k < n; ++k) o[k] = b[k];
}
void add_row(float* __restrict acc, const float* __restrict g, const int64_t n) {
  for (int64_t k = 0; k < n; ++k) acc[k] += g[k];
}

// A bf16 copy of n floats in the Context's scratch.
const bf16* bf16_copy(Context& ctx, const float* src, int64_t n) {
  bf16* d = alloc_bf16(ctx, n);
  convert_to_bf16(ctx, src, d, n);
  return d;
}
// A weight's bf16 copy: the Context's cached one (once per version) when it has a cache.
const bf16* bf16_weight(Context& ctx, const float* w, int64_t n) {
  return ctx.bf16_weights() != nullptr ? ctx.bf16_weights()->copy(ctx, w, n) : bf16_copy(ctx, w, n);
}
}  // namespace

void matmul_forward(Context& ctx, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC) {
  if (ctx.precision() == Precision::bf16) {
    matmul_forward(ctx, out, bf16_copy(ctx, inp, int64_t{N} * C), weight, bias, N, C, OC);
    return;
  }
  if (bias != nullptr) {
    ctx.parallel_for(N, [&](int, int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) copy_row(out + r * OC, bias, OC);
    });
  }
  gemm(ctx, false, true, N, OC, C, 1.0f, inp, C, weight, C, bias != nullptr ? 1.0f : 0.0f, out, OC);
}

namespace {
// The bias gradient: dbias (OC) += Σ rows of dout, in row order per column slice.
void bias_backward(Context& ctx, float* dbias, const float* dout, int N, int OC) {
  ctx.parallel_for_aligned(OC, 16, [&](int, int64_t o0, int64_t o1) {
    if (o0 == o1) return;
    for (int64_t r = 0; r < N; ++r) add_row(dbias + o0, dout + r * OC + o0, o1 - o0);
  });
}

// dout's bf16 copy for the products, and with dbias (not null) the bias gradient, in one pass
// over dout: per column slice, rows in order (bias_backward's sums, convert_to_bf16's values).
// Into g (N·OC values).
void dout_bf16(Context& ctx, bf16* g, float* dbias, const float* dout, int N, int OC) {
  if (dbias == nullptr) {
    convert_to_bf16(ctx, dout, g, int64_t{N} * OC);
    return;
  }
  ctx.parallel_for_aligned(OC, 16, [&](int, int64_t o0, int64_t o1) {
    if (o0 == o1) return;
    for (int64_t r = 0; r < N; ++r) {
      add_row(dbias + o0, dout + r * OC + o0, o1 - o0);
      convert_to_bf16(dout + r * OC + o0, g + r * OC + o0, o1 - o0);
    }
  });
}
// Into the Context's scratch.
const bf16* dout_bf16(Context& ctx, float* dbias, const float* dout, int N, int OC) {
  bf16* g = alloc_bf16(ctx, int64_t{N} * OC);
  dout_bf16(ctx, g, dbias, dout, N, OC);
  return g;
}

// The bf16 products of the two halves, on one bf16 copy of dout (g) given by the caller.
void backward_input_bf16(Context& ctx, float* dinp, const bf16* g, const float* weight, int N,
                         int C, int OC) {
  const bf16* w = bf16_weight(ctx, weight, int64_t{OC} * C);
  gemm_bf16(ctx, false, false, N, C, OC, g, OC, w, C, true, dinp, C);
}
void backward_weight_bf16(Context& ctx, float* dweight, const bf16* g, const bf16* x, int N, int C,
                          int OC) {
  // doutᵀ as a transposed view of dout's copy: oneDNN's kernels for a transposed source run
  // within 8% of a plain one at these shapes (K = the microbatch's rows), while a transposing
  // conversion cost several times that
  gemm_bf16(ctx, true, false, OC, C, N, g, OC, x, C, true, dweight, C);
}
void backward_weight_bf16(Context& ctx, float* dweight, const bf16* g, const float* inp, int N,
                          int C, int OC) {
  backward_weight_bf16(ctx, dweight, g, bf16_copy(ctx, inp, int64_t{N} * C), N, C, OC);
}
void check_bf16(const Context& ctx) {
  AP_CHECK(ctx.precision() == Precision::bf16,
           "a product of a bf16 input on a Context computing in {}", to_string(ctx.precision()));
}
}  // namespace

void matmul_backward(Context& ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC) {
  if (ctx.precision() == Precision::bf16) {
    // one bf16 copy of dout for both halves (the same bits as the halves called one by one),
    // made in the bias gradient's pass
    const bf16* g = dout_bf16(ctx, dbias, dout, N, OC);
    if (dinp != nullptr) backward_input_bf16(ctx, dinp, g, weight, N, C, OC);
    backward_weight_bf16(ctx, dweight, g, inp, N, C, OC);
    return;
  }
  if (dinp != nullptr) matmul_backward_input(ctx, dinp, dout, weight, N, C, OC);
  matmul_backward_weight(ctx, dweight, dbias, dout, inp, N, C, OC);
}

void matmul_backward_input(Context& ctx, float* dinp, const float* dout, const float* weight, int N,
                           int C, int OC) {
  if (ctx.precision() == Precision::bf16) {
    backward_input_bf16(ctx, dinp, bf16_copy(ctx, dout, int64_t{N} * OC), weight, N, C, OC);
    return;
  }
  gemm(ctx, false, false, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
}

void matmul_backward_weight(Context& ctx, float* dweight, float* dbias, const float* dout,
                            const float* inp, int N, int C, int OC) {
  if (ctx.precision() == Precision::bf16) {
    backward_weight_bf16(ctx, dweight, dout_bf16(ctx, dbias, dout, N, OC), inp, N, C, OC);
    return;
  }
  gemm(ctx, true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  if (dbias != nullptr) bias_backward(ctx, dbias, dout, N, OC);
}

void matmul_forward(Context& ctx, float* out, const bf16* inp, const float* weight,
                    const float* bias, int N, int C, int OC) {
  check_bf16(ctx);
  // the bias goes into the product (oneDNN adds it to each row as it writes it)
  const bf16* w = bf16_weight(ctx, weight, int64_t{OC} * C);
  gemm_bf16(ctx, false, true, N, OC, C, inp, C, w, C, false, out, OC, bias);
}

void matmul_backward(Context& ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                     const bf16* inp, const float* weight, int N, int C, int OC) {
  check_bf16(ctx);
  const bf16* g = dout_bf16(ctx, dbias, dout, N, OC);
  if (dinp != nullptr) backward_input_bf16(ctx, dinp, g, weight, N, C, OC);
  backward_weight_bf16(ctx, dweight, g, inp, N, C, OC);
}

void matmul_backward_weight(Context& ctx, float* dweight, float* dbias, const float* dout,
                            const bf16* inp, int N, int C, int OC) {
  check_bf16(ctx);
  backward_weight_bf16(ctx, dweight, dout_bf16(ctx, dbias, dout, N, OC), inp, N, C, OC);
}

void matmul_backward_input(Context& ctx, float* dinp, float* dbias, bf16* dout_bf16_out,
                           const float* dout, const float* weight, int N, int C, int OC) {
  check_bf16(ctx);
  dout_bf16(ctx, dout_bf16_out, dbias, dout, N, OC);
  if (dinp != nullptr) backward_input_bf16(ctx, dinp, dout_bf16_out, weight, N, C, OC);
}

void matmul_backward_products(Context& ctx, float* dinp, float* dweight, const bf16* dout,
                              const float* inp, const float* weight, int N, int C, int OC) {
  check_bf16(ctx);
  if (dinp != nullptr) backward_input_bf16(ctx, dinp, dout, weight, N, C, OC);
  if (dweight != nullptr) backward_weight_bf16(ctx, dweight, dout, inp, N, C, OC);
}

void matmul_backward_products(Context& ctx, float* dinp, float* dweight, const bf16* dout,
                              const bf16* inp, const float* weight, int N, int C, int OC) {
  check_bf16(ctx);
  if (dinp != nullptr) backward_input_bf16(ctx, dinp, dout, weight, N, C, OC);
  if (dweight != nullptr) backward_weight_bf16(ctx, dweight, dout, inp, N, C, OC);
}

}  // namespace actorpipe
