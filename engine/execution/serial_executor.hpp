// SerialExecutor: runs any validated schedule over d StageWorkers in one thread, in a fixed
// round-robin order; the readable reference that every parallel execution must match bitwise.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/batch.hpp"
#include "engine/devices/stage_devices.hpp"
#include "engine/execution/evaluation.hpp"
#include "engine/execution/gradient_reducer.hpp"
#include "engine/execution/optimizer_shard.hpp"
#include "engine/execution/stage_worker.hpp"
#include "engine/expected.hpp"
#include "engine/model/model.hpp"
#include "engine/model/partition.hpp"
#include "engine/options.hpp"
#include "engine/schedule/schedule.hpp"
#include "engine/stop_flag.hpp"

namespace actorpipe {

class DataLoader;

struct SerialExecutorOptions {
  Mode mode = Mode::onef1b;
  int microbatches = 1;      ///< m per optimizer step (pipedream: each microbatch is a step)
  int B = 1;                 ///< sequences per microbatch
  int T = 1;                 ///< tokens per sequence
  std::vector<int> threads;  ///< Context threads per stage; empty = 1 each
  Precision precision = Precision::fp32;  ///< pipeline.precision (resolve_precision)
  bool bf16_weight_copies = true;         ///< StageWorkerOptions::bf16_weight_copies
  bool bf16_stash = false;  ///< pipeline.stash_precision = "bf16" (StageWorkerOptions::bf16_stash)
  bool bf16_activations = true;  ///< StageWorkerOptions::bf16_activations
  bool lowered = true;           ///< run the schedules with their SEND/RECV actions
  /// pipeline.recompute: one flag per global layer (empty = none), StageWorkerOptions::recompute
  std::vector<bool> recompute;
  bool log_versions = false;  ///< keep every F/B's VersionUse (version_log())
  /// train.nonfinite = "skip" (gpipe and 1f1b only): a step whose loss or gradients are not
  /// finite is dropped on every stage (OptimizerShard::skip_update) instead of failing the run.
  bool skip_nonfinite = false;
  /// pipeline.replicas w: this executor is one replica of a data-parallel job; `microbatches` is
  /// its share of a step (m/w). Each stage's gradients are summed over the replicas through
  /// `reducer` (required when w > 1) as soon as the stage reaches the update, before the tied
  /// exchange (update protocol step 0.5). ReplicatedExecutor runs all w replicas.
  int replicas = 1;
  GradientReducer* reducer = nullptr;
  /// Per stage, the backend it computes on (StageWorkerOptions::backend; not owned, it must
  /// outlive the executor); empty, or nullptr for a stage: the stage's own CPU backend. The
  /// executor moves the tied values between stages through host memory.
  std::vector<ComputeBackend*> backends;
};

/// d StageWorkers, their OptimizerShards, and the loop that drives them. The loop sweeps the stages
/// in ascending order and runs each stage's next action when it is ready, one action per stage per
/// sweep, until every list is done:
///   F / B            ready when its input arrived (stage 0's F and the last stage's B need none;
///                    a follow_owner copy stage's F also needs the tied value it must install:
///                    the owner's version, or in xpipe the prediction the owner's F published);
///   SEND_F / SEND_B  always ready: the tensor goes onto the link to the neighbour;
///   RECV_F / RECV_B  ready when the matching SEND has executed;
///   OPT_STEP         runs the update protocol of StageWorker, begin_update to commit_update back
///                    to back (the shard's math on the stage's Context): global clipping waits
///                    for every stage to reach the same OPT_STEP (the tied gradients are summed
///                    there); otherwise (follow_owner) the owner of a tied pair waits for the
///                    copy's contribution; a stage that reaches an OPT_STEP begins its update at
///                    once;
///   FLUSH            ready when every stage has reached the same FLUSH.
/// Results do not depend on the sweep order: every value is a function of the data dependencies.
class SerialExecutor {
 public:
  /// Errors: bad options (microbatches, B, T, thread counts) or a partition of another model.
  static Expected<std::unique_ptr<SerialExecutor>> create(const Model& model,
                                                          const Partition& partition,
                                                          const OptimizerOptions& optimizer,
                                                          const SerialExecutorOptions& options);
  /// From a whole config: model, partition, mode, m, B, T (pipeline.seq_len or model.context),
  /// threads_per_stage, recompute ("auto" resolved first: resolve_partition). `own_model`:
  /// a user's own model (Model::from_layers) to run instead of the built-in one of
  /// config.model, which then describes it (options_for_model).
  /// With pipeline.replicas w > 1 the executor is replica `replica`'s pipeline (m/w
  /// microbatches a step: feed it replica_share's data) and needs `reducer` (that replica's).
  static Expected<std::unique_ptr<SerialExecutor>> create(const Config& config,
                                                          bool log_versions = false,
                                                          const Model* own_model = nullptr,
                                                          GradientReducer* reducer = nullptr);

  /// Microbatches a run of `steps` optimizer steps reads: steps·m (pipedream: steps).
  int64_t microbatches_for(int steps) const;
  /// The schedules a run of `steps` steps executes: `steps` one-step schedules for gpipe/1f1b,
  /// one schedule of `steps` steps otherwise (lowered when options().lowered). 2bw continues
  /// the previous run (make_2bw `continued`) when every stage holds its previous version (after
  /// a run, or a resume that restored it): runs of N and M steps compute the bits of one run of
  /// N + M steps.
  Expected<std::vector<Schedule>> schedules_for(int steps) const;

  /// Called once per optimizer step of a run, in order, as soon as every stage has committed
  /// that step's update: its number (1 = the run's first) and its loss. In the asynchronous
  /// modes a run is one schedule, so this is how a caller learns of a step before the run ends.
  using StepDone = std::function<void(int step, double loss)>;

  /// Runs `steps` optimizer steps over `batches` (exactly microbatches_for(steps) of them, in
  /// order). Returns the loss of each step: (1/m)·Σⱼ meanⱼ over its microbatches in order.
  /// Once `stop` is requested (null: never), a schedule of several steps (2bw, pipedream,
  /// xpipe) ends after the last step any microbatch of which stage 0 has begun: the stages run
  /// the rest of that step's run of so many steps (first_steps), which drains the pipeline
  /// there in pipedream and xpipe, and fewer losses come back. One-step schedules (gpipe, 1f1b)
  /// end at their end: the caller stops between them.
  Expected<std::vector<double>> run(int steps, std::span<const Microbatch> batches,
                                    const StepDone& on_step = {}, const StopFlag* stop = nullptr);
  /// As above, reading the microbatches from `data` (all of the run's up front; after a stop
  /// `data` is put back after those of the steps that ran).
  Expected<std::vector<double>> run(int steps, DataLoader& data, const StepDone& on_step = {},
                                    const StopFlag* stop = nullptr);

  /// Held-out evaluation between runs: each of `batches`, in order, through every stage's
  /// StageWorker::evaluate (stage 0 first), with the newest weights. Errors: a non-finite loss
  /// (naming the microbatch) or a microbatch of another shape.
  Expected<EvalResult> evaluate(std::span<const Microbatch> batches);
  /// As above, reading `microbatches` microbatches from `data`.
  Expected<EvalResult> evaluate(DataLoader& data, int microbatches);
  /// Runs one schedule (validated here) of the executor's mode whose microbatch j is
  /// batches[j]; returns one loss per optimizer step of the schedule.
  Expected<std::vector<double>> run_schedule(const Schedule& schedule,
                                             std::span<const Microbatch> batches,
                                             const StepDone& on_step = {},
                                             const StopFlag* stop = nullptr);

  const SerialExecutorOptions& options() const { return opts_; }
  const Model& model() const { return model_; }
  const Partition& partition() const { return partition_; }
  int stages() const { return partition_.stages(); }
  StageWorker& worker(int stage);
  const StageWorker& worker(int stage) const;
  /// Stage `stage`'s optimizer shard (its optimizer state).
  OptimizerShard& optimizer(int stage);
  const OptimizerShard& optimizer(int stage) const;
  /// Newest parameters of global layer `layer` (from the stage holding it), in that stage's
  /// memory (StageWorker::memory()).
  std::span<const float> params(int layer) const;
  /// Every F/B executed so far (log_versions), per stage in execution order, stages ascending.
  std::vector<VersionUse> version_log() const;
  /// Global microbatches consumed by the runs so far.
  int64_t microbatches_done() const { return mb_done_; }
  /// Steps dropped so far (skip_nonfinite); a StepDone callback sees the count with its step.
  int64_t skipped_steps() const { return skipped_; }

 private:
  SerialExecutor(const Model& model, const Partition& partition, const OptimizerOptions& optimizer,
                 const SerialExecutorOptions& options);
  struct Run;

  // pipeline.device's backends when create(config) opened them (before the workers, which free
  // their buffers into them, so that it is destroyed after them)
  std::unique_ptr<StageDevices> devices_;
  Model model_;
  Partition partition_;
  OptimizerOptions opt_;
  SerialExecutorOptions opts_;
  std::vector<std::unique_ptr<StageWorker>> workers_;
  std::vector<std::unique_ptr<OptimizerShard>> shards_;
  int64_t mb_done_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace actorpipe
