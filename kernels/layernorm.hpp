// Layer normalisation over the last dimension. N rows (= B*T), C channels.
// Bitwise the same results for any thread count (rows or channel slices are independent).
#pragma once

#include "kernels/bf16.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

/// out (N,C), mean (N), rstd (N) from inp (N,C), weight (C), bias (C); eps = 1e-5.
void layernorm_forward(Context& ctx, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C);
/// The same, each output rounded to bf16 as it is written (for a product's input): the bits of
/// layernorm_forward followed by convert_to_bf16, in one pass.
void layernorm_forward(Context& ctx, bf16* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C);

/// Accumulates (+=) into dinp (N,C), dweight (C), dbias (C). Reductions over N run in row order
/// (per channel, starting from the value already in dweight / dbias).
void layernorm_backward(Context& ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

}  // namespace actorpipe
