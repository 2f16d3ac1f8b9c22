// Layer costs: the checks every planner input goes through (finite, non-negative times, the
// weight half inside the backward, non-negative bytes), each error naming the layer and field.
#include "engine/planner/layer_costs.hpp"

#include <cmath>
#include <utility>

namespace actorpipe {
namespace {

Status check_seconds(size_t layer, const char* field, double v) {
  if (!std::isfinite(v) || v < 0) {
    return make_error("layer {}: {} = {} is not allowed: it must be finite and >= 0 seconds", layer,
                      field, v);
  }
  return {};
}

Status check_bytes(size_t layer, const char* field, std::int64_t v) {
  if (v < 0)
    return make_error("layer {}: {} = {} is not allowed: it must be >= 0", layer, field, v);
  return {};
}

}  // namespace

Status check_layer_costs(std::span<const LayerCosts> layers) {
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerCosts& l = layers[i];
    for (const auto& [field, v] :
         {std::pair{"forward", l.forward}, std::pair{"backward", l.backward},
          std::pair{"backward_weight", l.backward_weight}, std::pair{"update", l.update}}) {
      if (auto st = check_seconds(i, field, v); !st) return st;
    }
    if (l.backward_weight > l.backward) {
      return make_error(
          "layer {}: backward_weight = {} is not allowed: it is part of backward = {}", i,
          l.backward_weight, l.backward);
    }
    for (const auto& [field, v] :
         {std::pair{"parameter_bytes", l.parameter_bytes},
          std::pair{"gradient_bytes", l.gradient_bytes},
          std::pair{"optimizer_bytes", l.optimizer_bytes},
          std::pair{"version_bytes", l.version_bytes},
          std::pair{"weight_copy_bytes", l.weight_copy_bytes},
          std::pair{"activation_bytes", l.activation_bytes},
          std::pair{"recompute_activation_bytes", l.recompute_activation_bytes},
          std::pair{"output_bytes", l.output_bytes}}) {
      if (auto st = check_bytes(i, field, v); !st) return st;
    }
  }
  return {};
}

}  // namespace actorpipe
