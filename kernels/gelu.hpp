// GELU, tanh approximation (as GPT-2): 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
#pragma once

#include "kernels/bf16.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

/// out (N) = gelu(inp (N)). Element-wise: bitwise the same for any thread count.

void gelu_forward(Context& ctx, float* out, const float* inp, long N);
/// The same, each output rounded to bf16 as it is written (for a product's input): the bits of
/// gelu_forward followed by convert_to_bf16, in one pass.
void gelu_forward(Context& ctx, bf16* out, const float* inp, long N);
/// dinp (N) += gelu'(inp) · dout.
void gelu_backward(Context& ctx, float* dinp, const float* inp, const float* dout, long N);
/// The backward of a GELU that feeds a linear layer's bf16 products, in one pass over
/// (rows, cols) values: v = gelu'(inp) · dout (gelu_backward's bits into a zeroed dinp),
/// dinp = bf16(v) (the products' operand) and dbias (cols) += Σ rows of v (the linear layer's
/// bias gradient, in matmul_backward's order: per column, rows in order). The f32 v is never
/// stored.
void gelu_backward(Context& ctx, bf16* dinp, float* dbias, const float* inp, const float* dout,
                   int rows, int cols);

}  // namespace actorpipe
