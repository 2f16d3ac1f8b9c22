// Gradient check: a model's analytic gradients (its layers' backward) against central finite
// differences of its loss, and each layer's split backward against its one-pass backward. For
// anyone writing a Layer of their own (docs/api.md); the built-in models pass it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/batch.hpp"
#include "engine/expected.hpp"
#include "engine/model/model.hpp"

namespace actorpipe {

struct GradientCheckOptions {
  /// Central-difference step added to and subtracted from one f32 parameter at a time.
  double step = 1e-2;
  /// Entries checked per parameter slot, evenly spread over it (all of a smaller slot).
  int entries_per_slot = 24;
  /// An entry passes when |analytic − fd| <= tolerance · (max |fd| over the slot's checked
  /// entries + |fd|). The loss is computed in f32, so fd carries rounding noise of about
  /// 1e-7·loss/step: 2e-2 leaves room for it and still catches a wrong factor or term.
  double tolerance = 2e-2;
  /// Every parameter starts at the model's init plus N(0, jitter²) noise (a tied copy equal to
  /// its owner), so that no gradient is as small as the f32 noise of a finite difference (at a
  /// transformer's init many are, ~1e-5); 0 checks at the init itself.
  double jitter = 0.3;
  /// Seed of the jitter and of the random inputs and output gradients of the split-backward
  /// comparison.
  uint64_t seed = 1;
};

/// One parameter slot's result.
struct SlotCheck {
  std::string name;    ///< checkpoint name, layers.<i>.<slot>
  size_t checked = 0;  ///< entries compared
  double scale = 0.0;  ///< max |fd| over them
  double worst = 0.0;  ///< max |analytic − fd| / scale
  size_t failed = 0;   ///< entries outside the tolerance
};

/// One layer's split backward (Layer::backward with a DeferredGrads) against its one-pass
/// backward: din on return and the gradients after DeferredGrads::run must be the same bits.
struct SplitCheck {
  int layer = 0;
  std::string type;
  size_t deferred = 0;  ///< weight-gradient tasks the layer recorded (0: it does not split)
  bool din_equal = true;
  bool grads_equal = true;
};

struct GradientCheck {
  double loss = 0.0;               ///< the loss the gradients are of: mean over the microbatches
  std::vector<SlotCheck> slots;    ///< every slot but tied copies (checked with their owner)
  std::vector<SplitCheck> splits;  ///< every layer
  bool passed() const;
  /// The failures, one per line ("layers.2.w1: 3 of 24 entries off, worst 0.31"), or "passed".
  std::string describe() const;
};

/// Checks `model` (parameters at its seeded init plus jitter) on microbatches `mbs` (all of one
/// shape (B, T), T <= context): the loss is (1/m)·Σⱼ meanⱼ as in a step, and its gradient w.r.t.
/// each checked entry comes once from the layers' backward and once from (loss(p + step) − loss(p −
/// step)) / (2·step), a tied parameter moved in both places at once. Errors: no microbatches, or a
/// bad shape.
Expected<GradientCheck> check_gradients(const Model& model, std::span<const Microbatch> mbs,
                                        const GradientCheckOptions& options = {});

}  // namespace actorpipe
