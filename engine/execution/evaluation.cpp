// Evaluation: combining per-microbatch losses, in microbatch order.
#include "engine/execution/evaluation.hpp"

namespace actorpipe {

EvalResult combine_eval_losses(std::span<const double> means, int64_t tokens_per_microbatch) {
  EvalResult r;
  for (double m : means) r.loss += m;
  r.microbatches = static_cast<int64_t>(means.size());
  r.tokens = r.microbatches * tokens_per_microbatch;
  if (!means.empty()) r.loss /= static_cast<double>(means.size());
  return r;
}

}  // namespace actorpipe
