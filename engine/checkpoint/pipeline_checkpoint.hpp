// Pipeline checkpoint: the state of d stages (workers: parameters, update count, older live
// weight versions; optimizer shards: optimizer state) under stage-independent names, and back.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "engine/checkpoint/checkpoint.hpp"
#include "engine/expected.hpp"
#include "engine/options.hpp"

namespace actorpipe {

class OptimizerShard;
class StageWorker;

/// Where a run stands when it is checkpointed.
struct RunPosition {
  int64_t step = 0;            ///< optimizer steps completed
  uint64_t data_position = 0;  ///< DataLoader::position() of the next microbatch
  bool final = false;          ///< written as <dir>/final
};

/// The manifest of a checkpoint of a run of `config` at `position` whose stages have applied
/// `updates` optimizer updates. Besides the CheckpointInfo fields, `extra` records what a resume
/// must agree on or restore: "updates", "data.kind", "data.seed", "data.synthetic_seed",
/// "pipeline.microbatch_size", "pipeline.seq_len" (the sequence length T in use),
/// "pipeline.microbatches". rng_state holds {train.seed, data.seed}: the seeds
/// of every random stream of a run (data draws are keyed by position, so no generator advances).
CheckpointInfo pipeline_checkpoint_info(const Config& config, const RunPosition& position,
                                        long updates);

/// Views of the stages' tensors (no copy): `model` holds each layer's newest parameters (from
/// the workers), one tensor per slot, "layers.<i>.<slot>" (a tied copy under its own name, equal
/// to its owner); `optimizer` the state per slot (from the optimizer shards, optimizers[r] being
/// stage r's), "<param>.adam_m" and "<param>.adam_v" (AdamW; a matrix that rotates under
/// optimizer.basis_rotation: "<param>.adam_m_rotated", its m in the rotated basis, and the
/// rotation's arrays) or "<param>.momentum" (SGD; docs/checkpoints.md lists every state);
/// `versions` every older version the stages still hold, "<param>@v<k>" with k its update count.
/// Errors: a microbatch in flight or an update open, stages that have applied different numbers
/// of updates, shards that are not the workers' stages'. The stages must outlive the views.
Expected<CheckpointRefs> pipeline_checkpoint_refs(std::span<StageWorker* const> workers,
                                                  std::span<OptimizerShard* const> optimizers);

/// tensor_bytes(pipeline_checkpoint_refs(...)): the tensor bytes a checkpoint of these stages
/// holds, counted without copying anything out of a stage's memory. Errors: as
/// pipeline_checkpoint_refs.
Expected<uint64_t> pipeline_checkpoint_bytes(std::span<StageWorker* const> workers,
                                             std::span<OptimizerShard* const> optimizers);

/// pipeline_checkpoint_info + pipeline_checkpoint_refs + save_checkpoint: writes
/// <dir>/step-<N> or <dir>/final atomically and returns its path.
Expected<std::string> save_pipeline_checkpoint(const std::string& dir, const Config& config,
                                               const RunPosition& position,
                                               std::span<StageWorker* const> workers,
                                               std::span<OptimizerShard* const> optimizers);

/// Whether a checkpoint can continue a run of `config`. Refuses, naming every mismatch with
/// the checkpoint's and the config's value: a model key that changes the parameters
/// (check_compatible), optimizer.kind (another state layout), and what changes the meaning of
/// the saved data position: data.kind, pipeline.microbatch_size and the sequence length. The
/// mode, the number of stages, the partition and the remaining optimizer keys may differ.
Status check_resume(const CheckpointInfo& info, const Config& config);

/// Loads a checkpoint's parameters into idle workers and its optimizer state into their stages'
/// optimizer shards (optimizers[r] being stage r's), of any partition of the same model, and
/// sets every worker's update count. Every tensor the stages need must be present with its
/// shape; errors name the tensor and what does not match. The workers' runs then start from the
/// loaded weights. 2bw: when the checkpoint holds every stage's previous version (version
/// updates - 1 in versions.safetensors), it is restored too, so the next run continues exactly
/// (make_2bw `continued`); other modes restore no older version (a run boundary).
Status load_pipeline_checkpoint(const CheckpointContents& checkpoint,
                                std::span<StageWorker* const> workers,
                                std::span<OptimizerShard* const> optimizers);

}  // namespace actorpipe
