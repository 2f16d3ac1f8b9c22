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

}  // namespace actorpipe
