// Layer costs: what the planner knows of one layer — its times per microbatch and per update,
// and its bytes by kind (parameters, gradients, optimizer state, stashed and boundary activations).
#pragma once

#include <cstdint>
#include <span>

#include "engine/expected.hpp"

namespace actorpipe {

/// One layer's costs. Nothing here measures: a profiler fills them (or a test, by hand). Times
/// are seconds of one microbatch (forward, backward) or of one optimizer update; bytes are exact
/// counts.
struct LayerCosts {
  double forward = 0.0;   ///< forward of one microbatch
  double backward = 0.0;  ///< backward of one microbatch (input and weight gradients)
  /// The weight half of a split backward: the part of `backward` that runs after the layer's
  /// input gradient is ready (<= backward).
  double backward_weight = 0.0;
  double update = 0.0;  ///< one optimizer update of the layer's parameters

  std::int64_t parameter_bytes = 0;  ///< the parameters (the weight version in use)
  std::int64_t gradient_bytes = 0;   ///< the gradient accumulator
  std::int64_t optimizer_bytes = 0;  ///< optimizer state (AdamW: m and v)
  std::int64_t version_bytes = 0;    ///< one extra weight version (2bw's shadow, a stash entry)
  /// pipeline.precision = "bf16": the bf16 copy the products read of one stored weight version
  /// (half of parameter_bytes; a stage keeps one per version it stores); 0 in fp32.
  std::int64_t weight_copy_bytes = 0;
  /// Activations kept from a microbatch's forward for its backward, without recompute.
  std::int64_t activation_bytes = 0;
  /// The same with recompute: only the layer's input is kept and the backward runs the forward
  /// again first (so the backward grows by `forward`).
  std::int64_t recompute_activation_bytes = 0;
  /// The layer's output for one microbatch: what crosses a stage boundary after this layer
  /// (forward) and what comes back (its gradient, the same size).
  std::int64_t output_bytes = 0;

  /// What recomputing saves per microbatch stashed (negative when it costs memory).
  std::int64_t recompute_saving() const { return activation_bytes - recompute_activation_bytes; }
};

/// Checks every layer: times finite and >= 0, backward_weight <= backward, bytes >= 0. The
/// error names the layer, the field and the value: "layer 3: forward = -1 is not allowed: ...".
Status check_layer_costs(std::span<const LayerCosts> layers);

}  // namespace actorpipe
