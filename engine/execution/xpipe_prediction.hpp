// XPipe weight prediction: the weights a forward computes with, extrapolated from the current
// weights and the optimizer state by the number of updates that land before its backward.
#pragma once

#include <vector>

#include "engine/model/layer.hpp"
#include "engine/options.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

/// Writes into `out` (layer.param_floats()) the weights predicted `lookahead` updates ahead of
/// `params`, whose optimizer `state` (optimizer_state_floats layout) is that after `updates`
/// updates. Element-wise, in float, with lr = scheduled_lr(o, updates + 1) (the next update's
/// learning rate) and k = float(lookahead)·lr:
///   adamw: bc1 = 1 − β1^updates, bc2 = 1 − β2^updates (computed as in adamw_update),
///          denom = sqrt(v) / sqrt(bc2) + eps,
///          out = w − k·((m / bc1) / denom + wd·w)    (wd: the slot's decoupled weight decay)
///   sgd:   out = w − k·buf                           (buf: the momentum buffer)
///   adamw with basis rotation, a slot that rotates: out = w − k·(d + wd·w), d =
///          rotated_adamw_direction (the same step in the rotated basis, brought back)
/// With updates == 0 (the moments are still zero) or lookahead == 0 there is nothing to
/// extrapolate from: out = params.
///
/// With basis rotation, d depends only on the state (and updates), not on lookahead, and costs
/// two rotations of each matrix: given `directions`, the first prediction from a state keeps
/// its rotated slots' d there and the next predictions from the same state (the step's other
/// forwards) read them back, with the same bits. Whoever changes the state other than by an
/// update that counts in `updates` (a load) clears them.
struct RotatedDirections {
  long updates = -1;          ///< the state d was computed from (−1: none kept)
  std::vector<float> floats;  ///< layer.param_floats(): each rotated slot's d at its offset

  void clear() { updates = -1; }
};
void predict_weights(Context& ctx, const OptimizerOptions& o, const Layer& layer,
                     const float* params, const float* state, long updates, int lookahead,
                     float* out, RotatedDirections* directions = nullptr);

}  // namespace actorpipe
