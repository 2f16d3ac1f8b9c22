// Metrics: what a training step reports (loss, tokens, wall time, per-stage busy and idle time)
// and its JSON-lines form, one object per step, written to train.metrics.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actors/actor_engine.hpp"
#include "engine/expected.hpp"

namespace actorpipe {

/// Where one stage's wall time went, cumulative since the trainer started training.
struct StageMetrics {
  double busy_seconds = 0.0;  ///< computing (F, B) and updating its weights
  double idle_seconds = 0.0;  ///< waiting for an input, a credit or a weight version
};

/// What one optimizer step reports.
struct StepMetrics {
  int64_t step = 0;        ///< optimizer steps completed, counting those before a resume
  int64_t steps = 0;       ///< the step count training stops at (train.steps)
  int64_t first_step = 0;  ///< steps completed when this trainer started (0, or the resumed step)
  double loss = 0.0;       ///< the step's loss: (1/m)·Σⱼ meanⱼ over its microbatches
  int64_t tokens = 0;      ///< tokens consumed since this trainer started (B·T per microbatch)
  double seconds = 0.0;    ///< training wall time since this trainer started
  std::vector<StageMetrics> stages;  ///< per stage; empty when not measured (serial backend)
  /// The step's update was dropped on every stage (train.nonfinite = "skip"): its loss or its
  /// gradients were not finite; weights and optimizer state are those of the step before.
  bool skipped = false;
  int64_t skipped_steps = 0;  ///< steps dropped since this trainer started

  /// Tokens per second since this trainer started (0 before any time has passed).
  double tokens_per_second() const;
  /// Estimated seconds until `steps`, from the mean time per step of this trainer so far.
  double eta_seconds() const;
};

/// One held-out evaluation (Trainer::evaluate; eval.every during train()).
struct EvalMetrics {
  int64_t step = 0;   ///< optimizer steps done when it ran (the weights it measured)
  double loss = 0.0;  ///< (1/k)·Σⱼ meanⱼ over the k held-out microbatches, as a step's loss
  int64_t microbatches = 0;  ///< k (eval.microbatches)
  int64_t tokens = 0;        ///< tokens read: B·T per microbatch
  double seconds = 0.0;      ///< wall time of the pass
};

/// {"eval":{"step":20,"loss":2.3025,"microbatches":8,"tokens":1024,"time":0.012000}}
/// (the loss as in metrics_json; null when not finite).
std::string eval_json(const EvalMetrics& metrics);

/// One JSON object on one line (no newline), with the loss printed so that it reads back to the
/// same double (a non-finite value is null) and times in seconds to the microsecond:
///   {"step":12,"loss":2.3025,"tokens":6144,"time":1.520000,"busy":[1.200000,1.300000],
///    "idle":[0.300000,0.200000]}
/// busy and idle hold seconds per stage, cumulative like StepMetrics::stages. A skipped step's
/// line ends with ,"skipped":true (and its loss is null when not finite).
std::string metrics_json(const StepMetrics& metrics);

/// A migration manager's verdict as one JSON line of train.metrics (no newline):
/// {"migration":{"step":20,"forced":false,"moved":true,"from":[1,7],"to":[4,4],
/// "imbalance":0.99,"busy":[..],"speed":[..],"predicted_now":..,"predicted_new":..,
/// "layers_moved":3,"bytes_moved":..,"move_seconds":..,"reason":"...","error":""}}
std::string migration_json(const MigrationEvent& event);

/// The line a resumed run writes before its first step:
/// {"resumed":{"step":50,"checkpoint":"ckpt/step-50","dropped":7}}
/// dropped: the lines of steps after the checkpoint (and a line cut short) that the run before
/// wrote and this one replays.
std::string resumed_json(int64_t step, const std::string& checkpoint, int64_t dropped);

/// The line a training stopped on request (Trainer::request_stop) writes last:
/// {"stopped":{"step":37,"signal":"SIGTERM","checkpoint":"ckpt/step-37"}}
/// signal: the signal that asked, or "" when the program asked; checkpoint: "" when none was
/// written (no checkpoint.dir).
std::string stopped_json(int64_t step, const std::string& signal, const std::string& checkpoint);

/// The line an automatic restart (train.max_restarts) writes after the pipeline is rebuilt:
/// {"restart":{"step":8,"restart":1,"max_restarts":3,"checkpoint":"ckpt/step-8",
/// "error":"the run of steps 9 to 12: ..."}}
/// step: where it continues from; checkpoint: "" when it starts over.
std::string restart_json(int64_t step, int restart, int max_restarts, const std::string& checkpoint,
                         const std::string& error);

/// Prepares train.metrics for a run resumed at `step`: keeps every line about a step at or
/// before it (steps, evaluations, migrations, earlier resumes, restarts and stops), drops the rest
/// and any line that is not one of these (a write the lost run had not finished), then appends
/// resumed_json. The file is rewritten through a temporary file in its directory and renamed over,
/// so a failure leaves it as it was; a file that does not exist is created. Returns the number of
/// lines dropped. Errors name the path and the failing call.
Expected<int64_t> resume_metrics_file(const std::string& path, int64_t step,
                                      const std::string& checkpoint);

/// Prepares train.metrics for a training that starts over after a failure, with no checkpoint
/// to continue from (a restart or a relaunch before the first checkpoint): as
/// resume_metrics_file at step 0 without the "resumed" line, so the earlier restarts' lines stay
/// and the steps that will be trained again go. Returns the number of lines dropped.
Expected<int64_t> restart_metrics_file(const std::string& path);

}  // namespace actorpipe
