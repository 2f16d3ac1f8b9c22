#include "kernels/precision.hpp"

namespace actorpipe {

std::string_view to_string(Precision p) {
  return p == Precision::bf16 ? "bf16" : "fp32";
}

std::optional<Precision> parse_precision(std::string_view name) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  return std::nullopt;
}

}  // namespace actorpipe
