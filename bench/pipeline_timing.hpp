// Pipeline timing: one configuration (mode, stages, threads per stage) of the actor engine
// trained for a few steps, its steady-state step time, tokens/s and per-stage busy share.
#pragma once

#include <memory>
#include <vector>

#include "actors/actor_engine.hpp"
#include "engine/data/loader.hpp"
#include "engine/expected.hpp"
#include "engine/mode.hpp"
#include "engine/options.hpp"

namespace actorpipe {
class ProcessGroup;
}  // namespace actorpipe

namespace actorpipe::bench {

/// What to run: a GPT `model` on microbatches of B sequences of T tokens.
struct PipelineRunSpec {
  ModelOptions model;
  int B = 1;
  int T = 1;
  Mode mode = Mode::onef1b;
  int stages = 1;
  int threads_per_stage = 1;
  int microbatches = 8;        ///< m per optimizer step
  std::vector<int> partition;  ///< layers per stage; empty = even
  bool split_backward = true;  ///< pipeline.split_backward
  /// The engine's own cost: every message and hand-off, no compute (ActorEngineOptions).
  bool skip_compute = false;
  int warmup = 1;  ///< untimed steps at the start of a run (at least 1)
  int reps = 3;    ///< timed steps (at least 1)
  int runs = 1;    ///< runs of warmup+reps steps on the same engine; each run's steps count
  /// A job of several processes (each rank calls measure_pipeline with the same spec): the
  /// stages are placed one per rank by default. Only rank 0 times steps; the others fill in
  /// cpu_seconds and timed_seconds for their whole runs.
  ProcessGroup* group = nullptr;
  /// pipeline.replicas (a job of replicas × the pipeline's processes).
  int replicas = 1;
  /// Record the runs' spans: with replicas, PipelineRunResult's all-reduce figures.
  bool record_spans = false;
  /// optimizer.delay_correction: none, nesterov, dc (asynchronous modes).
  std::string delay_correction = "none";
  /// optimizer.momentum_decay: NAdam's momentum schedule with nesterov (0: a constant β1).
  float momentum_decay = 0.0f;
  /// optimizer.basis_rotation: AdamW in the eigenbasis of the gradients' covariances.
  bool basis_rotation = false;
  /// optimizer.rotation_block: the rotation's sides in diagonal blocks of this many (0: whole).
  int rotation_block = 0;
  /// pipeline.precision: fp32, bf16.
  std::string precision = "fp32";
};

/// What it measured. A "step" is m microbatches (pipedream: m of its one-microbatch steps).
struct PipelineRunResult {
  std::vector<double> step_seconds_all;  ///< every timed step, runs one after another
  double step_seconds = 0.0;             ///< median of step_seconds_all
  double tokens_per_s = 0.0;             ///< m·B·T / step_seconds
  std::vector<double> stage_busy;        ///< per stage: busy share of the timed steps (last run)
  double timed_seconds = 0.0;            ///< wall time of the timed steps, all runs
  double cpu_seconds = 0.0;  ///< CPU time of the process (every thread) over the timed steps
  double first_loss = 0.0;   ///< loss of the first step (≈ ln V at initialisation)
  /// record_spans with replicas, this process, every run: the all-reduces' time, and the part
  /// of it during a backward of this process's stages (allreduce_hidden_seconds).
  double allreduce_seconds = 0.0;
  double allreduce_hidden_seconds = 0.0;
  /// Floats this process's stages keep for the delay correction (StageWorker::
  /// delay_correction_floats, summed over its stages).
  size_t delay_correction_floats = 0;
};

/// How much of `reduces` lies inside the union of `backwards` (seconds): each all-reduce's
/// overlap with the backward spans, merged first so that overlapping ones count once.
double hidden_seconds(const std::vector<ReduceSpan>& reduces,
                      const std::vector<ActionSpan>& backwards);

/// Builds the config of `spec` (synthetic data, default AdamW with clipping), creates an
/// ActorEngine and runs it `runs` times for warmup+reps steps (pipedream: (warmup+reps)·m).
/// t_k is when the driver has the loss of step k's last microbatch (ActorCallbacks::on_step);
/// the timed steps are t_{k+1} - t_k for k >= warmup, so neither the run's start (actor spawn,
/// first touch of the buffers, the pipeline filling) nor its drain is in them.
/// With `group` on a rank other than 0: no step times (its process has no driver); cpu_seconds
/// and timed_seconds cover its whole runs and stage_busy is empty.
/// Errors: the engine's (a bad config names its key) or a failed run.
Expected<PipelineRunResult> measure_pipeline(const PipelineRunSpec& spec);

/// The step times of a run from the on_step times: `seconds[s-1]` is when step s (1-based) was
/// reported; steps are grouped `group` at a time (pipedream: m) and t_k = seconds[k·group - 1].
/// Returns t_{k+1} - t_k for k = warmup .. K-1, K = seconds.size() / group.
std::vector<double> step_periods(const std::vector<double>& seconds, int group, int warmup);

/// A data loader that cycles through `pool` microbatches taken once from `source`, so that
/// producing a microbatch costs a copy and no sampling. position() counts every next().
class ReplayLoader final : public DataLoader {
 public:
  ReplayLoader(DataLoader& source, int pool);
  Microbatch next() override;
  uint64_t position() const override { return position_; }
  void seek(uint64_t position) override { position_ = position; }
  int vocab_size() const override { return vocab_; }
  std::optional<double> entropy_rate() const override { return entropy_; }
  std::string describe() const override;

 private:
  std::vector<Microbatch> pool_;
  uint64_t position_ = 0;
  int vocab_ = 0;
  std::optional<double> entropy_;
  std::string source_;
};

}  // namespace actorpipe::bench
