// Multi-head scaled dot-product attention over a fused qkv (B,T,3C) input, NH heads of
// size hs = C/NH. Causal (GPT) or bidirectional with a key padding mask (BERT).
#pragma once

#include <cstdint>

#include "kernels/bf16.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

/// In bf16 (ctx.precision()) the products take bf16 copies of q, k, v (and dout) and of each
/// head's probabilities and their gradient, accumulated in f32; softmax stays f32.
/// out (B,T,C); att (B,NH,T,T) keeps the softmax probabilities for the backward.
/// key_mask (B,T): 1 = attend, 0 = padding (may be null = all keys valid). For causal
/// attention key t2 > t is excluded too. A query whose every key is masked gets zeros.
/// Masked entries of att are 0. In fp32 q, k, v are read in place (strided views of qkv);
/// each (b, h) pair is a task of its own (Context::parallel_tasks: a free thread takes the next),
/// so the result is bitwise the same for any thread count.
void attention_forward(Context& ctx, float* out, float* att, const float* qkv,
                       const uint8_t* key_mask, bool causal, int B, int T, int C, int NH);

/// Accumulates (+=) into dqkv (B,T,3C). `scratch` must hold threads()*T*T floats
/// (B*NH*T*T always suffices). Masked keys need no mask here (their att entries are 0);
/// `causal` must match the forward: it lets the backward skip the zero upper triangle
/// (passing false for a causal att is correct, only slower). Bitwise the same for any
/// thread count.
void attention_backward(Context& ctx, float* dqkv, float* scratch, const float* dout,
                        const float* qkv, const float* att, int B, int T, int C, int NH,
                        bool causal = false);

/// The bf16 forward and backward (ctx.precision() bf16, else a CheckFailure) on qkv already
/// rounded to bf16: the bits of the calls above on the f32 qkv it rounds, without rounding it
/// again (a block keeping its bf16 activations keeps qkv so, in half the floats). The scores
/// (q·kᵀ, and dout·vᵀ in the backward) are one product per head on contiguous copies of the
/// head's rows (oneDNN's brgemm kernels take those, not the strided views), all T×T of them;
/// the other products run by causal blocks on the strided views.
void attention_forward(Context& ctx, float* out, float* att, const bf16* qkv,
                       const uint8_t* key_mask, bool causal, int B, int T, int C, int NH);
void attention_backward(Context& ctx, float* dqkv, float* scratch, const float* dout,
                        const bf16* qkv, const float* att, int B, int T, int C, int NH,
                        bool causal);

}  // namespace actorpipe
