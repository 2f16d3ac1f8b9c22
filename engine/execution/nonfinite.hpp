// Non-finite gradients: finding the first layer whose gradients are not finite, and the error
// that names it (train.nonfinite = "stop"); the same words on every backend.
#pragma once

#include <span>
#include <string>

namespace actorpipe {

class Model;

/// Index of the first entry of `per_layer` (a stage's Σg² per layer, in layer order) that is
/// not finite, or -1 when all are.
int first_nonfinite(std::span<const double> per_layer);

/// "non-finite gradient in step 7 at layer 3 (gpt_block; sum of squares inf)": `layer` is the
/// global layer index, `step` the optimizer step (1-based, counting every step of the training).
std::string nonfinite_gradient(const Model& model, long step, int layer, double sumsq);

}  // namespace actorpipe
