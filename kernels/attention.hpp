// Multi-head scaled dot-product attention over a fused qkv (B,T,3C) input, NH heads of
// size hs = C/NH. Causal (GPT) or bidirectional with a key padding mask (BERT).
#pragma once

#include <cstdint>

#include "kernels/context.hpp"

namespace actorpipe {

/// out (B,T,C); att (B,NH,T,T) keeps the softmax probabilities for the backward.
/// key_mask (B,T): 1 = attend, 0 = padding (may be null = all keys valid). For causal
/// attention key t2 > t is excluded too. A query whose every key is masked gets zeros.
void attention_forward(Context& ctx, float* out, float* att, const float* qkv,
                       const uint8_t* key_mask, bool causal, int B, int T, int C, int NH);

/// Accumulates (+=) into dqkv (B,T,3C). `scratch` must hold B*NH*T*T floats.
void attention_backward(Context& ctx, float* dqkv, float* scratch, const float* dout,
                        const float* qkv, const float* att, int B, int T, int C, int NH);

}  // namespace actorpipe
