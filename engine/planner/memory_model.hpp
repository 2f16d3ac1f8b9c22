// Memory model: the bytes one stage holds in a mode — parameters, gradients, optimizer state,
// the extra weight versions its schedule keeps, their bf16 copies and the activations of its
// peak stash.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/planner/layer_costs.hpp"
#include "engine/planner/stage_factors.hpp"

namespace actorpipe {

/// One stage's bytes by kind. Sums saturate at INT64_MAX instead of overflowing.
struct StageBytes {
  std::int64_t parameters = 0;  ///< Σ parameter_bytes
  std::int64_t gradients = 0;   ///< Σ gradient_bytes
  std::int64_t optimizer = 0;   ///< Σ optimizer_bytes
  std::int64_t versions = 0;    ///< (versions_kept - 1) · Σ version_bytes
  /// bf16: versions_kept · Σ weight_copy_bytes (every stored version's copy); 0 in fp32
  std::int64_t weight_copies = 0;
  /// peak_stash · Σ activation bytes stashed per microbatch (recompute_activation_bytes for a
  /// recomputed layer, activation_bytes otherwise)
  std::int64_t activations = 0;

  std::int64_t total() const;
  /// "parameters 10, gradients 10, optimizer 20, versions 0, activations 12" (and ", bf16
  /// copies 5" when there are any).
  std::string to_string() const;

  friend bool operator==(const StageBytes&, const StageBytes&) = default;
};

/// The bytes of a stage holding `layers` (consecutive, in order) where layer k is recomputed
/// when recompute[k] (a missing flag, e.g. an empty vector, is false), with the factors of its
/// place in the mode's schedule:
///   parameters + gradients + optimizer + (versions_kept - 1) · versions
///   + versions_kept · weight copies + peak_stash · Σ stashed activations per microbatch.
StageBytes stage_bytes(std::span<const LayerCosts> layers, const std::vector<bool>& recompute,
                       const StageFactors& factors);

/// a + b and a · b for bytes >= 0, saturating at INT64_MAX.
std::int64_t saturating_add(std::int64_t a, std::int64_t b);
std::int64_t saturating_mul(std::int64_t a, std::int64_t b);

}  // namespace actorpipe
