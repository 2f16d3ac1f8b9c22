// Memory check: before a run allocates its stages, the least memory they need is compared with
// what their memory has left (the host's RAM, a GPU's), so a model that cannot fit is an error
// naming its size keys, not std::bad_alloc (or the kernel's OOM killer) in the middle of building
// it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "engine/expected.hpp"
#include "engine/mode.hpp"
#include "engine/model/model.hpp"
#include "engine/model/partition.hpp"
#include "kernels/backend_memory.hpp"
#include "kernels/precision.hpp"

namespace actorpipe {

/// The least bytes `stages` of a run hold whatever else happens: per parameter float of their
/// layers 4 bytes each for the weights, the gradient accumulator, the optimizer state (AdamW 2,
/// SGD 1) and the extra weight version 2bw, pipedream and xpipe keep (at least 1), in bf16 2
/// more per version for its bf16 copy; with `bf16_stash` (pipeline.stash_precision = "bf16")
/// the extra version's product operands but tied ones (Model::bf16_stash_floats) are only that
/// copy, 4 bytes fewer each; and for one microbatch of B sequences of T tokens, each stage's output
/// (B·T·width floats) and the last stage's logits (B·T·vocab_size floats). Stashes of more
/// microbatches and channel buffers come on top.
uint64_t least_stage_bytes(const Model& model, const Partition& partition, Mode mode,
                           const std::string& optimizer_kind, std::span<const int> stages, int B,
                           int T, Precision precision = Precision::fp32, bool bf16_stash = false);

/// Errors when least_stage_bytes(stages) exceeds `available` (default: host_available_bytes();
/// no check when unknown), naming the bytes and the keys that size them: "model.width = 100000,
/// model.depth = 2, model.vocab_size = 8192, model.context = 64, pipeline.microbatch_size = 8,
/// sequence length 64: the stages here need at least 1.2 TiB (weights, gradients, adamw state
/// and weight versions of 1.2e+11 parameter floats, and one microbatch's activations),
/// 20.1 GiB of memory is available".
Status check_memory_fits(const Model& model, const Partition& partition, Mode mode,
                         const std::string& optimizer_kind, std::span<const int> stages, int B,
                         int T, std::optional<uint64_t> available = host_available_bytes(),
                         Precision precision = Precision::fp32, bool bf16_stash = false);

/// check_memory_fits for this process's `stages`, counted per memory pool
/// (BackendMemory::pool): stage r's memory is memories[r] (host memory when `memories` is empty
/// or memories[r] is null; a stage's backend is its memory), and the stages of one pool must fit in
/// its available_bytes() together: the host's RAM for stages on the CPU and on a CheckedBackend, a
/// GPU's free memory for the stages on it. A stage off the host keeps no bf16 weight copies (its
/// backend rounds each product's operands), so precision and bf16_stash count for the stages on the
/// host only. Off the host the error names the stages and the memory: "... the stages [0, 1] on
/// cuda:0 (<GPU name>) need at least <bytes> (...), <bytes> is free there".
Status check_stages_fit(const Model& model, const Partition& partition, Mode mode,
                        const std::string& optimizer_kind, std::span<const int> stages,
                        std::span<BackendMemory* const> memories, int B, int T,
                        Precision precision = Precision::fp32, bool bf16_stash = false);

}  // namespace actorpipe
