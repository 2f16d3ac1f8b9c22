// XPipe weight prediction: the weights a forward computes with, extrapolated from the current
// weights and the optimizer state by the number of updates that land before its backward.
#include "engine/execution/xpipe_prediction.hpp"

#include <algorithm>
#include <cmath>

#include "engine/execution/layer_optimizer.hpp"
#include "kernels/check.hpp"

namespace actorpipe {

void predict_weights(Context& ctx, const OptimizerOptions& o, const Layer& layer,
                     const float* params, const float* state, long updates, int lookahead,
                     float* out) {
  AP_CHECK(updates >= 0 && lookahead >= 0, "updates = {}, lookahead = {}", updates, lookahead);
  const size_t n = layer.param_floats();
  if (updates == 0 || lookahead == 0) {
    std::copy(params, params + n, out);
    return;
  }
  const bool adamw = o.kind == "adamw";
  AP_CHECK(adamw || o.kind == "sgd", "optimizer.kind = \"{}\"", o.kind);
  const float k = static_cast<float>(lookahead) * scheduled_lr(o, updates + 1);
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(o.beta1), updates));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(o.beta2), updates));
  const float bc2_sqrt = std::sqrt(bc2);
  const float eps = o.eps;
  for (const ParamSlot& slot : layer.slots()) {
    const float wd = slot.decay ? o.weight_decay : 0.0f;
    const float* __restrict w = params + slot.offset;
    float* __restrict y = out + slot.offset;
    const float* __restrict m = state + slot.offset;  // adamw m | sgd momentum
    const float* __restrict v = adamw ? state + n + slot.offset : nullptr;  // adamw only
    ctx.parallel_for_aligned(static_cast<int64_t>(slot.numel), 16,
                             [&](int, int64_t i0, int64_t i1) {
                               if (adamw) {
                                 for (int64_t i = i0; i < i1; ++i) {
                                   const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
                                   y[i] = w[i] - k * ((m[i] / bc1) / denom + wd * w[i]);
                                 }
                               } else {
                                 for (int64_t i = i0; i < i1; ++i) y[i] = w[i] - k * m[i];
                               }
                             });
  }
}

}  // namespace actorpipe
