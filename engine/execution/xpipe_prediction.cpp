// XPipe weight prediction: the weights a forward computes with, extrapolated from the current
// weights and the optimizer state by the number of updates that land before its backward.
#include "engine/execution/xpipe_prediction.hpp"

#include <algorithm>
#include <cmath>

#include "engine/execution/layer_optimizer.hpp"
#include "kernels/check.hpp"
#include "kernels/compute_backend.hpp"
#include "kernels/optimizer.hpp"

namespace actorpipe {

void predict_weights(Context& ctx, const OptimizerOptions& o, const Layer& layer,
                     const float* params, const float* state, long updates, int lookahead,
                     float* out, RotatedDirections* directions) {
  AP_CHECK(updates >= 0 && lookahead >= 0, "updates = {}, lookahead = {}", updates, lookahead);
  const size_t n = layer.param_floats();
  ComputeBackend& backend = ctx.backend();  // the CPU's on the host, else the stage's device
  if (updates == 0 || lookahead == 0) {
    backend.copy(out, params, n);
    return;
  }
  const bool adamw = o.kind == "adamw";
  AP_CHECK(adamw || o.kind == "sgd", "optimizer.kind = \"{}\"", o.kind);
  WeightPrediction p;
  p.k = static_cast<float>(lookahead) * scheduled_lr(o, updates + 1);
  p.bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(o.beta1), updates));
  p.bc2_sqrt =
      std::sqrt(1.0f - static_cast<float>(std::pow(static_cast<double>(o.beta2), updates)));
  p.eps = o.eps;
  const auto& slots = layer.slots();
  // the rotated slots' directions: kept from an earlier prediction from this state, or
  // computed now (and kept, given a place; a layer without a rotated slot keeps nothing)
  const bool kept = directions != nullptr && directions->updates == updates;
  for (size_t s = 0; s < slots.size(); ++s) {
    const ParamSlot& slot = slots[s];
    p.wd = slot.decay ? o.weight_decay : 0.0f;
    if (const RotationShape shape = slot_rotation(o, slot); shape.any()) {
      // basis rotation: AdamW's direction in the rotated basis, brought back (on the host)
      AP_CHECK(ctx.host_backend(),
               "optimizer.basis_rotation: predicted on the host only, not on {}", backend.name());
      const RotationState st =
          rotation_state(shape, const_cast<float*>(state) + rotation_state_offset(o, layer, s));
      if (directions == nullptr) {
        rotated_xpipe_predict(ctx, out + slot.offset, params + slot.offset, state + slot.offset,
                              state + n + slot.offset, shape, st, p);
        continue;
      }
      if (directions->floats.size() < n) directions->floats.resize(n);
      float* d = directions->floats.data() + slot.offset;
      if (!kept)
        rotated_adamw_direction(ctx, state + slot.offset, state + n + slot.offset, shape, st, p.bc1,
                                p.bc2_sqrt, p.eps, d);
      xpipe_predict_along(ctx, out + slot.offset, params + slot.offset, d,
                          static_cast<int64_t>(slot.numel), p);
      continue;
    }
    const float* m = state + slot.offset;                        // adamw m | sgd momentum
    const float* v = adamw ? state + n + slot.offset : nullptr;  // adamw only
    backend.xpipe_predict(out + slot.offset, params + slot.offset, m, v, slot.numel, p);
  }
  if (directions != nullptr) directions->updates = updates;
}

}  // namespace actorpipe
