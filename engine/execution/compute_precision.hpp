// pipeline.precision checked against this machine: the Precision every stage's Context computes
// its matrix products in.
#pragma once

#include <string_view>

#include "engine/expected.hpp"
#include "kernels/precision.hpp"

namespace actorpipe {

/// "fp32" or "bf16". Errors name the value: an unknown precision; "bf16" on a CPU without bf16
/// instructions (AVX512_BF16 or AMX, as oneDNN sees it: ONEDNN_MAX_CPU_ISA can lower it), where
/// oneDNN would emulate them more slowly than fp32 computes. `cpu_kernels` false: no stage
/// computes with the CPU kernels (every one on a GPU, pipeline.device = "cuda"), so the CPU's
/// bf16 instructions do not matter.
Expected<Precision> resolve_precision(std::string_view name, bool cpu_kernels = true);

}  // namespace actorpipe
