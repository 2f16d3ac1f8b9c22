#include "engine/execution/compute_precision.hpp"

#include "kernels/bf16_gemm.hpp"

namespace actorpipe {

Expected<Precision> resolve_precision(std::string_view name, bool cpu_kernels) {
  const auto p = parse_precision(name);
  if (!p) {
    return make_error("pipeline.precision = \"{}\": unknown precision (allowed: fp32, bf16)", name);
  }
  if (*p == Precision::bf16 && cpu_kernels && !bf16_support().native) {
    return make_error(
        "pipeline.precision = \"bf16\": this CPU has no bf16 instructions oneDNN can use ({}); "
        "{}: use pipeline.precision = \"fp32\"",
        bf16_support().describe(),
        bf16_support().products ? "emulated bf16 products would be slower than fp32"
                                : "without AVX-512 oneDNN cannot compute bf16 products at all");
  }
  return *p;
}

}  // namespace actorpipe
