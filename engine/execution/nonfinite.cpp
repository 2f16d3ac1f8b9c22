// Non-finite gradients: the first such layer and its message.
#include "engine/execution/nonfinite.hpp"

#include <fmt/format.h>

#include <cmath>

#include "engine/model/model.hpp"

namespace actorpipe {

int first_nonfinite(std::span<const double> per_layer) {
  for (size_t i = 0; i < per_layer.size(); ++i)
    if (!std::isfinite(per_layer[i])) return static_cast<int>(i);
  return -1;
}

std::string nonfinite_gradient(const Model& model, long step, int layer, double sumsq) {
  return fmt::format("non-finite gradient in step {} at layer {} ({}; sum of squares {})", step,
                     layer, model.layer(layer).type(), sumsq);
}

}  // namespace actorpipe
