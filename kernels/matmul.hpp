// Linear layer: out = inp · weightᵀ + bias. N rows, C input channels, OC output channels.
// GEMMs go through gemm(); dbias sums rows in order per column slice: bitwise the same
// results for any thread count. With ctx.precision() == bf16 the products take bf16 copies of
// their operands (made in the call, in the Context's arena) and accumulate in f32 through
// gemm_bf16(); bias, dbias and every output stay f32.
#pragma once

#include "kernels/bf16.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

/// out (N,OC) = inp (N,C) · weight (OC,C)ᵀ + bias (OC); bias may be null. The bias is
/// written into out first and the GEMM accumulates onto it (no extra pass).
void matmul_forward(Context& ctx, float* out, const float* inp, const float* weight,
                    const float* bias, int N, int C, int OC);

/// Accumulates (+=) into dinp (N,C), dweight (OC,C), dbias (OC). dinp or dbias may be null.
/// The same bits as matmul_backward_input followed by matmul_backward_weight.
void matmul_backward(Context& ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int C, int OC);

/// The input half of matmul_backward: dinp (N,C) += dout (N,OC) · weight (OC,C).
void matmul_backward_input(Context& ctx, float* dinp, const float* dout, const float* weight, int N,
                           int C, int OC);

/// The weight half of matmul_backward: dweight (OC,C) += doutᵀ · inp, dbias (OC) += Σ rows of
/// dout (dbias may be null). Independent of the input half: either may run first.
void matmul_backward_weight(Context& ctx, float* dweight, float* dbias, const float* dout,
                            const float* inp, int N, int C, int OC);

/// bf16 products whose input the caller keeps in bf16 already (ctx.precision() must be bf16):
/// the same bits as the calls above given f32 values that round to `inp`, without rounding it
/// again. matmul_forward, matmul_backward and matmul_backward_weight.
void matmul_forward(Context& ctx, float* out, const bf16* inp, const float* weight,
                    const float* bias, int N, int C, int OC);
void matmul_backward(Context& ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                     const bf16* inp, const float* weight, int N, int C, int OC);
void matmul_backward_weight(Context& ctx, float* dweight, float* dbias, const float* dout,
                            const bf16* inp, int N, int C, int OC);

/// matmul_backward's products on a dout that the caller made in bf16 already (ctx.precision()
/// must be bf16), e.g. in the pass of an element-wise backward that also took the bias gradient
/// (gelu_backward's bf16 form): dinp and dweight (either may be null) as matmul_backward
/// computes them from f32 values that round to `dout`. The input in f32 (rounded here) or in
/// bf16.
void matmul_backward_products(Context& ctx, float* dinp, float* dweight, const bf16* dout,
                              const float* inp, const float* weight, int N, int C, int OC);
void matmul_backward_products(Context& ctx, float* dinp, float* dweight, const bf16* dout,
                              const bf16* inp, const float* weight, int N, int C, int OC);
/// The input half of a bf16 backward that leaves its weight half for later (ctx.precision()
/// must be bf16): rounds dout (N,OC) into dout_bf16 (N·OC values, for the weight half's
/// matmul_backward_products), adds the bias gradient (dbias, may be null) in that pass, and
/// dinp += dout·weight (dinp may be null). The bits of matmul_backward.
void matmul_backward_input(Context& ctx, float* dinp, float* dbias, bf16* dout_bf16,
                           const float* dout, const float* weight, int N, int C, int OC);

}  // namespace actorpipe
