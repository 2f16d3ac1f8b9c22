// Memory check: before a run allocates its stages, the least memory they need is compared with
// what the machine has, so a model that cannot fit is an error naming its size keys, not
// std::bad_alloc (or the kernel's OOM killer) in the middle of building it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "engine/expected.hpp"
#include "engine/mode.hpp"
#include "engine/model/model.hpp"
#include "engine/model/partition.hpp"

namespace actorpipe {

/// The least bytes `stages` of a run hold whatever else happens: per parameter float of their
/// layers 4 bytes each for the weights, the gradient accumulator, the optimizer state (AdamW 2,
/// SGD 1) and the extra weight version 2bw, pipedream and xpipe keep (at least 1). Activations,
/// stashes and channel buffers come on top.
uint64_t least_stage_bytes(const Model& model, const Partition& partition, Mode mode,
                           const std::string& optimizer_kind, std::span<const int> stages);

/// MemAvailable of /proc/meminfo in bytes, when it can be read.
std::optional<uint64_t> available_memory_bytes();

/// Errors when least_stage_bytes(stages) exceeds `available` (default: available_memory_bytes();
/// no check when unknown), naming the bytes, the parameter count and the keys that size the
/// model: "model.width = 100000, model.depth = 2, model.vocab_size = 8192: the model's
/// stages here need at least 1.2 TiB (weights, gradients, optimizer state and weight versions of
/// 1.2e+11 parameters), 20.1 GiB of memory is available".
Status check_memory_fits(const Model& model, const Partition& partition, Mode mode,
                         const std::string& optimizer_kind, std::span<const int> stages,
                         std::optional<uint64_t> available = available_memory_bytes());

}  // namespace actorpipe
