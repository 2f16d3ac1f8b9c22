// Evaluation: what a forward-only pass over held-out microbatches reports, and how their losses
// combine (the same average as a training step's).
#pragma once

#include <cstdint>
#include <span>

namespace actorpipe {

/// The result of one evaluation.
struct EvalResult {
  double loss = 0.0;         ///< (1/k)·Σⱼ meanⱼ over the k microbatches, as a step's loss
  int64_t microbatches = 0;  ///< k
  int64_t tokens = 0;        ///< targets that counted, summed
  double seconds = 0.0;      ///< wall time of the pass
};

/// The EvalResult of the per-microbatch mean losses, in microbatch order (seconds left 0).
EvalResult combine_eval_losses(std::span<const double> means, int64_t tokens_per_microbatch);

}  // namespace actorpipe
