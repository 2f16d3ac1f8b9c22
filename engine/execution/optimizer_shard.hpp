// Optimizer shard: the optimizer state of one pipeline stage's parameters, and the update math
// that applies an UpdateJob of that stage with it (AdamW or SGD, per-slot rules, clip scales).
#pragma once

#include <span>
#include <vector>

#include "engine/execution/layer_optimizer.hpp"
#include "engine/execution/update_job.hpp"
#include "engine/model/model.hpp"
#include "engine/model/partition.hpp"
#include "engine/options.hpp"
#include "kernels/backend_memory.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

/// The optimizer state of stage `stage`'s layers (AdamW: m then v per layer; SGD: momentum),
/// zero at the start, and the one function that changes it. Executors keep one shard per stage
/// beside the stage's StageWorker; the worker never writes the state. The state is written only
/// inside run_update, that is between the worker's begin_update and commit_update of an update;
/// at any other time anyone may read it (checkpoints; an xpipe worker's forwards predict their
/// weights from it, see StageWorker::predict_from). One thread at a time calls run_update.
class OptimizerShard {
 public:
  /// The state lives in `memory` (which must outlive the shard): host memory, or the memory of
  /// the backend the stage's worker computes on (run_update's ctx must compute on it then).
  OptimizerShard(const Model& model, const Partition& partition, int stage,
                 const OptimizerOptions& optimizer, BackendMemory& memory = host_backend_memory());
  OptimizerShard(const OptimizerShard&) = delete;
  OptimizerShard& operator=(const OptimizerShard&) = delete;

  int stage() const { return stage_; }
  /// Global index of the stage's first layer; the shard holds state for num_layers() layers.
  int first_layer() const { return first_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  const OptimizerOptions& options() const { return opt_; }

  /// Optimizer state of local layer i (optimizer_state_floats of its parameters): AdamW m then
  /// v, SGD momentum, in the shard's memory. Writable for checkpoint loading, while no update
  /// runs.
  std::span<float> state(int i);
  std::span<const float> state(int i) const;
  /// The memory the state lives in.
  BackendMemory& memory() const { return *state_.memory(); }

  /// Protocol step 4 (StageWorker's class comment): applies `job` (this stage's, gradients
  /// finished, not applied yet) on `ctx`: every layer's parameters in the version being
  /// produced -= the optimizer's step `job.step()` with this state, each slot as its SlotUpdate
  /// says (optimizer_update_slots). The same pass zeroes the job's gradients (the worker
  /// accumulates a later update into that buffer) and writes the new weights' bf16 rounding
  /// where the job asks for it (UpdateJob::rounded); then the job is marked applied. Bits depend
  /// only on the job, the state and `scales`, never on ctx's thread count.
  void run_update(Context& ctx, UpdateJob& job, const UpdateScales& scales);
  /// Instead of run_update, for a step dropped on every stage (train.nonfinite = "skip"): the
  /// version being produced keeps the weights it starts with and the state stays as it is; the
  /// job's gradients are zeroed (on ctx's backend, as run_update computes) and it is marked
  /// applied.
  void skip_update(Context& ctx, UpdateJob& job);

 private:
  OptimizerOptions opt_;
  int stage_ = 0;
  int first_ = 0;
  std::vector<std::shared_ptr<const Layer>> layers_;
  std::vector<size_t> offsets_;  // per local layer, floats into state_
  BackendBuffer state_;
  std::vector<SlotRule> rules_;  // run_update's, per slot of one layer
};

}  // namespace actorpipe
