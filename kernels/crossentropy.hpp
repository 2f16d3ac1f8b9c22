// Fused softmax + cross-entropy with an ignore index. N rows (= B*T), V classes.
#pragma once

#include <cstdint>

#include "kernels/context.hpp"

namespace actorpipe {

inline constexpr int32_t kIgnoreIndex = -1;

/// losses (N): −log softmax(logits)[target] (0 where target == kIgnoreIndex);
/// probs (N,V) keeps the softmax for the backward (may alias logits).
/// Returns the number of non-ignored rows.
int crossentropy_forward(Context& ctx, float* losses, float* probs, const float* logits,
                         const int32_t* targets, int N, int V);

/// dlogits (N,V) = (probs − onehot(target)) · dloss for every non-ignored row, 0 otherwise
/// (overwrites; may alias probs). dloss is the same scalar for every row (1/count for a mean).
void crossentropy_backward(Context& ctx, float* dlogits, const float* probs,
                           const int32_t* targets, float dloss, int N, int V);

/// Sum of losses in row order, in double.
double sum_losses(const float* losses, int N);

}  // namespace actorpipe
