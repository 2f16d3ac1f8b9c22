// Fused softmax + cross-entropy with an ignore index. N rows (= B*T), V classes.
// Rows are independent: bitwise the same results for any thread count.
#pragma once

#include <cstdint>

#include "kernels/bf16.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

inline constexpr int32_t kIgnoreIndex = -1;

/// losses (N): −log softmax(logits)[target] (0 where target == kIgnoreIndex);
/// probs (N,V) keeps the softmax for the backward (may alias logits). Rows whose target is
/// kIgnoreIndex are skipped: their probs row is left as it was (the backward never reads it).
/// A target outside [0, V) other than kIgnoreIndex is a CheckFailure.
/// Returns the number of non-ignored rows.
int crossentropy_forward(Context& ctx, float* losses, float* probs, const float* logits,
                         const int32_t* targets, int N, int V);

/// The losses of crossentropy_forward alone (the same bits), without writing the
/// probabilities: one pass over each row for its maximum and one for its exponentials' sum.
/// Returns the number of non-ignored rows.
int crossentropy_losses(Context& ctx, float* losses, const float* logits, const int32_t* targets,
                        int N, int V);

/// dlogits (N,V) = (probs − onehot(target)) · dloss for every non-ignored row, 0 otherwise
/// (overwrites; may alias probs). dloss is the same scalar for every row (1/count for a mean).
void crossentropy_backward(Context& ctx, float* dlogits, const float* probs, const int32_t* targets,
                           float dloss, int N, int V);

/// Forward and backward in one pass over the logits: losses (N) as crossentropy_forward and
/// dlogits (N,V) as crossentropy_backward (overwrites; may alias logits), bitwise equal to
/// calling the two in turn. Returns the number of non-ignored rows.
int crossentropy_forward_backward(Context& ctx, float* losses, float* dlogits, const float* logits,
                                  const int32_t* targets, float dloss, int N, int V);

/// The same with dlogits rounded to bf16 as each row is made (the bf16 products' operand): the
/// bits of the f32 call followed by convert_to_bf16, without the f32 dlogits (a row of V floats
/// per thread of scratch instead of N·V). Returns the number of non-ignored rows.
int crossentropy_forward_backward(Context& ctx, float* losses, bf16* dlogits, const float* logits,
                                  const int32_t* targets, float dloss, int N, int V);

/// crossentropy_losses (the same bits), also keeping each row's statistics for the backward
/// below: stats[2r] = the row's largest logit, stats[2r + 1] = Σ exp(logit − largest) in the
/// kernels' lane order (rows whose target is ignored: left as they were).
int crossentropy_losses(Context& ctx, float* losses, float* stats, const float* logits,
                        const int32_t* targets, int N, int V);

/// dlogits (N,V) = dloss·(softmax − onehot) from the forward's stats, in one pass over each row
/// (no maximum or sum again): the bits of crossentropy_forward_backward's dlogits, in f32 or
/// rounded to bf16 as they are made. An ignored row gets zeros.
void crossentropy_backward(Context& ctx, float* dlogits, const float* stats, const float* logits,
                           const int32_t* targets, float dloss, int N, int V);
void crossentropy_backward(Context& ctx, bf16* dlogits, const float* stats, const float* logits,
                           const int32_t* targets, float dloss, int N, int V);

/// Number of targets that are not kIgnoreIndex.
int count_targets(const int32_t* targets, int N);

/// Sum of losses in row order, in double.
double sum_losses(const float* losses, int N);

}  // namespace actorpipe
