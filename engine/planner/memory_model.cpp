// Memory model: sums a stage's bytes by kind from its layers, the recompute flags and the
// versions and stash its schedule keeps, saturating instead of overflowing.
#include "engine/planner/memory_model.hpp"

#include <fmt/format.h>

#include <limits>

namespace actorpipe {

std::int64_t saturating_add(std::int64_t a, std::int64_t b) {
  std::int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) return std::numeric_limits<std::int64_t>::max();
  return out;
}

std::int64_t saturating_mul(std::int64_t a, std::int64_t b) {
  std::int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::numeric_limits<std::int64_t>::max();
  return out;
}

std::int64_t StageBytes::total() const {
  std::int64_t t = 0;
  for (std::int64_t v : {parameters, gradients, optimizer, versions, weight_copies, activations}) {
    t = saturating_add(t, v);
  }
  return t;
}

std::string StageBytes::to_string() const {
  std::string s =
      fmt::format("parameters {}, gradients {}, optimizer {}, versions {}, activations {}",
                  parameters, gradients, optimizer, versions, activations);
  if (weight_copies > 0) s += fmt::format(", bf16 copies {}", weight_copies);
  return s;
}

StageBytes stage_bytes(std::span<const LayerCosts> layers, const std::vector<bool>& recompute,
                       const StageFactors& factors) {
  StageBytes b;
  std::int64_t versions = 0, copies = 0, stashed = 0;
  for (size_t k = 0; k < layers.size(); ++k) {
    const LayerCosts& l = layers[k];
    b.parameters = saturating_add(b.parameters, l.parameter_bytes);
    b.gradients = saturating_add(b.gradients, l.gradient_bytes);
    b.optimizer = saturating_add(b.optimizer, l.optimizer_bytes);
    versions = saturating_add(versions, l.version_bytes);
    copies = saturating_add(copies, l.weight_copy_bytes);
    const bool r = k < recompute.size() && recompute[k];
    stashed = saturating_add(stashed, r ? l.recompute_activation_bytes : l.activation_bytes);
  }
  b.versions = saturating_mul(factors.versions_kept - 1, versions);
  b.weight_copies = saturating_mul(factors.versions_kept, copies);
  b.activations = saturating_mul(factors.peak_stash, stashed);
  return b;
}

}  // namespace actorpipe
