// Actor engine: trains with one actor per stage and per optimizer shard plus a driver, all in
// one process and concurrently, computing bit for bit what the serial executor computes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/execution/evaluation.hpp"
#include "engine/expected.hpp"
#include "engine/options.hpp"
#include "engine/schedule/schedule.hpp"
#include "engine/stop_flag.hpp"

namespace actorpipe {

class ComputeBackend;
class DataLoader;
class OptimizerShard;
class Model;
class Placement;
class ProcessGroup;
class StageWorker;

/// Where a stage's wall time went (seconds since the run started).
struct StageTimes {
  /// Inside the stage's actions (F, B, ...), plus the waits for a new weight version while its
  /// optimizer shard computed it (an update that overlaps the stage's actions counts once).
  double busy_seconds = 0.0;
  /// Waiting for an input, a credit, a flush or a new weight version (the rest of the waits).
  double idle_seconds = 0.0;
  int64_t actions = 0;  ///< actions executed
  friend bool operator==(const StageTimes&, const StageTimes&) = default;
  /// Adds another span of time's figures (consecutive runs or segments).
  StageTimes& operator+=(const StageTimes& o) {
    busy_seconds += o.busy_seconds;
    idle_seconds += o.idle_seconds;
    actions += o.actions;
    return *this;
  }
};

/// Progress after every optimizer step, in step order. A step is complete when every stage has
/// committed its update of it (not when its last loss is known: in gpipe that comes after the
/// forwards, before the backwards).
struct StepProgress {
  int step = 0;       ///< optimizer steps completed in this run (1, 2, ...)
  int steps = 0;      ///< optimizer steps this run will do
  double loss = 0.0;  ///< the step's loss: (1/m)·Σⱼ meanⱼ, as the serial executor computes it
  int64_t tokens = 0;    ///< tokens consumed so far in this run (B·T per microbatch)
  double seconds = 0.0;  ///< when the step completed (its last update), since the run started
  std::vector<StageTimes> stages;  ///< per stage, cumulative since the run started
  /// The step was dropped on every stage (train.nonfinite = "skip"; its loss is not finite or
  /// its gradients were not).
  bool skipped = false;
};

/// One executed action, for traces: stage, action (its text form names the span), start and end
/// in seconds since the run started.
struct ActionSpan {
  int stage = 0;
  Action action;
  double start = 0.0;
  double end = 0.0;
};

/// One all-reduce of a stage's gradients over the replicas (pipeline.replicas), as its stage's
/// reducer thread ran it: which update, how many floats (a layer's, or the stage's whole
/// buffer), start and end in seconds since the run started.
struct ReduceSpan {
  int stage = 0;
  long step = 0;
  int64_t floats = 0;
  double start = 0.0;
  double end = 0.0;
};

/// Test hook: makes one stage fail at one microbatch, to exercise failure handling.
struct FaultInjection {
  enum class Kind : uint8_t {
    none,
    throw_in_forward,   ///< the stage's F of `microbatch` throws
    throw_in_backward,  ///< the stage's B of `microbatch` throws
    poison_output,      ///< the stage's F output of `microbatch` is NaN (a non-finite loss follows)
    /// the gradient the stage's B of `microbatch` receives is NaN (stage < last: its weight
    /// gradients turn non-finite while every loss stays finite)
    poison_gradient,
    /// the stage's SEND_F of `microbatch` never announces it (a stall follows); in one process
    /// only: between processes the channel announces it with the payload
    drop_activation,
  };
  Kind kind = Kind::none;
  int stage = -1;
  int64_t microbatch = -1;  ///< global microbatch index
};

/// How the engine runs (not what it computes: results never depend on these).
struct ActorEngineOptions {
  /// Threads of the cooperative scheduler, which runs only the driver: one is enough, and every
  /// further one polls for work on the cores the stages compute on. Stage actors and optimizer
  /// shards are detached: each owns one more thread (a stage also its Context's
  /// threads_per_stage - 1 helpers).
  int scheduler_threads = 1;
  /// Before an actor's thread sleeps waiting for a message it needs next (a stage for its input
  /// or its shard's new version, a shard for its peer's tied gradient or its clip scale), it
  /// polls its mailbox for up to this many microseconds, so a prompt message costs no wake-up.
  /// Bounds the CPU a waiting actor burns; 0 sleeps at once.
  int spin_before_wait_us = 50;
  /// In a job of several processes every stage gets each microbatch's release up to `credits`
  /// microbatches ahead of stage 0's credits, so neither a release's hop between processes nor
  /// the driver's wake-up for a credit is on the path of the stages' inputs. Off: releases
  /// follow the credits (to compare).
  bool release_ahead_remote = true;
  /// Control messages between actors of different processes (losses, credits, commits,
  /// microbatch releases, clip sums and scales, tied announcements) travel on the job's UCX
  /// workers (actors/internal/remote_mail.hpp). Off: through CAF's middleman (to compare).
  bool remote_mail = true;
  /// Between stages in two processes, the UCX channels carry each activation's and gradient's
  /// announcement right after its payload. Off: the announcements go as run messages (remote
  /// mail), as those of the NCCL channels always do (to compare, and to test that path where no
  /// GPU is).
  bool announce_on_channels = true;
  /// A stage whose channels lead to other processes drives their transport (UCX) itself while
  /// it waits for a message, for up to this many microseconds (instead of spin_before_wait_us)
  /// before its thread sleeps and the transport's progress thread takes over: an input that
  /// lands meanwhile costs no thread wake-up. Bounds the CPU a waiting stage burns per wait.
  int poll_before_wait_us = 1000;
  /// A run in which no action completes for this long fails with an error naming the stages
  /// and what each one waits for (a bug or a lost message; never a hang).
  double stall_timeout_seconds = 300.0;
  /// Engine overhead measurement: every message, channel hand-off, credit and optimizer round
  /// trip happens as usual but F, B and the update compute nothing (results are meaningless).
  bool skip_compute = false;
  /// Collect an ActionSpan for every executed action into ActorRunResult::spans.
  bool record_spans = false;
  /// Workers keep the weight version of every F and B (StageWorker::version_log()).
  bool log_versions = false;
  FaultInjection fault;
  /// The model to train: a user's own layers (Model::from_layers), described by config.model
  /// (options_for_model). Null: the built-in model of config.model (Model::build).
  std::shared_ptr<const Model> model;
  /// Test hook: called on an optimizer shard's thread right before each update's math, with the
  /// stage and the version the update produces (e.g. to slow an update down). Its time counts as
  /// the shard's compute.
  std::function<void(int stage, long version)> before_update;
  /// Benchmark hook: stage `slow_stage`'s forwards and backwards take `slowdown` times as long
  /// (the stage spins for the rest, counted as busy), as if it shared its core with another
  /// process. Results are unchanged. -1 / 1.0: off. ActorEngine::set_slowdown changes it
  /// between runs.
  int slow_stage = -1;
  double slowdown = 1.0;
  /// Per stage, the backend it computes on (StageWorkerOptions::backend; not owned, it must
  /// outlive the engine); empty, or nullptr for a stage: the stage's own CPU backend. Off the
  /// host a stage's optimizer shard updates on a companion of that backend
  /// (ComputeBackend::companion), the channels and the tied exchange carry host tensors, and
  /// what needs the host yet is refused (check_stage_backend).
  std::vector<ComputeBackend*> backends;
};

/// The migration manager's verdict at a boundary (docs/migration.md), with the numbers behind
/// it, and what its move did.
struct MigrationEvent {
  long step = 0;  ///< optimizer updates done (the stages' update count)
  /// A move of the automatic rule: the check (its step) that decided it; the run was then cut
  /// short after the step in flight, and the move made after `step`. Otherwise equal to step.
  long decided = 0;
  bool forced = false;         ///< a move of migration.moves (else the automatic rule's check)
  bool moved = false;          ///< the stages now hold `to`
  std::vector<int> from;       ///< layers per stage before
  std::vector<int> to;         ///< after a move; the proposal (or empty) otherwise
  std::string reason;          ///< one line: why (not)
  double imbalance = 0.0;      ///< checks: slowest stage's busy / mean busy - 1 over the window
  std::vector<double> busy;    ///< checks: per stage, busy seconds per step over the window
  std::vector<double> speed;   ///< checks that planned: the stage speed factors
  double predicted_now = 0.0;  ///< checks that planned: predicted step seconds of `from`
  double predicted_new = 0.0;  ///< ... and of the proposal
  int layers_moved = 0;
  int64_t bytes_moved = 0;    ///< the moved layers' state (parameters, optimizer, versions)
  int64_t bytes_sent = 0;     ///< of bytes_moved, what crossed between processes
  double move_seconds = 0.0;  ///< the move's wall time (the pause it adds)
  /// Non-empty when the move failed: the stages are unchanged and the run stops with it.
  std::string error;
  friend bool operator==(const MigrationEvent&, const MigrationEvent&) = default;
};

/// Called by the engine while it runs (on_step from the driver's thread, on_migration from the
/// caller's between segments; one call at a time).
struct ActorCallbacks {
  std::function<void(const StepProgress&)> on_step;
  /// Every verdict of the migration manager: forced moves, and every check of the automatic
  /// rule (moved or not).
  std::function<void(const MigrationEvent&)> on_migration;
  /// Read by the driver (rank 0's, in a job of several processes): once requested, gpipe and
  /// 1f1b end the run after the step in flight (no microbatch of a later step is fed; every
  /// stage ends its list after that step's flush), 2bw likewise (every stage's list becomes that of
  /// a run of so many steps: first_steps); pipedream and xpipe end at the run's end, or with
  /// `stop_drains` after the step in flight as 2bw (draining their pipeline there).
  /// ActorRunResult::stopped says so. Null: never.
  const StopFlag* stop = nullptr;
  /// train.stop = "step": a stop cuts pipedream's and xpipe's runs too.
  bool stop_drains = false;
};

/// What one run produced.
struct ActorRunResult {
  std::vector<double> losses;      ///< per optimizer step, in order
  std::vector<StageTimes> stages;  ///< per stage, whole run
  std::vector<ActionSpan> spans;   ///< record_spans only; per stage in execution order
  /// record_spans only: per stage in order, each update its optimizer shard ran (the OPT_STEP it
  /// came from), from the stage's hand-off to the new version's hand-back. In 2bw these overlap
  /// the stage's own spans: the stage computes while its shard writes the next version.
  std::vector<ActionSpan> update_spans;
  /// record_spans, pipeline.replicas > 1: this process's all-reduces, per stage in order. Each
  /// layer's gradients are summed as soon as the stage's last backward of the update has
  /// finished them (StageWorker::on_final_gradients), while the backward goes on.
  std::vector<ReduceSpan> reduce_spans;
  /// Credits: the most microbatches that were handed to the stages and not yet through stage 0's
  /// backward at once (the activation-stash bound of stage 0 in the mode's schedule).
  int peak_microbatches_ahead = 0;
  /// The migration manager's verdicts in this run, in order (as on_migration saw them).
  std::vector<MigrationEvent> migrations;
  int64_t tokens = 0;
  double seconds = 0.0;
  /// The tensors this process's stages sent to stages of other processes (activations,
  /// gradients, tied parameters' values): lent in memory both processes map
  /// (cluster.shared_memory, one host), or copied (UCX tag sends), and the bytes copied.
  int64_t tensors_lent = 0;
  int64_t tensors_copied = 0;
  int64_t bytes_copied = 0;
  /// A stop was requested (ActorCallbacks::stop; in a job of several processes, rank 0's): the
  /// run may have ended before `steps` (losses.size() steps ran; the data loader is past
  /// exactly their microbatches). Every process sees the same value.
  bool stopped = false;
};

/// A pipeline of d stage workers and their optimizer shards driven by actors. They keep their
/// state (weights, every live weight version; optimizer state) between runs, so a trainer can
/// run, checkpoint through worker() and optimizer(), and run again. A run is one schedule of the
/// configured mode over `steps` optimizer steps: for async modes it fills the pipeline at its start
/// and drains it at its end, exactly like the serial executor given the same schedule.
///
/// In a multi-process job (a ProcessGroup of several ranks) every process creates the engine
/// from the same config; each holds only the stages its rank runs (Placement: cluster.placement)
/// and calls run() with the same arguments. Rank 0 runs the driver; tensors between processes
/// move on UCX channels, control messages through CAF's middleman; the results are the bits of
/// the one-process engine.
class ActorEngine {
 public:
  /// Builds the model, the partition and one StageWorker per stage from `config`, parameters at
  /// their seeded initialisation. Errors name the config key and value at fault. With
  /// pipeline.partition = "auto" the partition is the planner's (resolve_partition,
  /// engine/profiler/auto_partition.hpp: a measured or cached profile) and config() holds its
  /// counts; not in a job of several processes (an error).
  /// With `group` (several ranks): only this rank's stages; the group must outlive the engine.
  /// Errors also name a placement that does not fit the job (cluster.placement).
  static Expected<std::unique_ptr<ActorEngine>> create(const Config& config,
                                                       const ActorEngineOptions& options = {},
                                                       ProcessGroup* group = nullptr);
  ~ActorEngine();
  ActorEngine(const ActorEngine&) = delete;
  ActorEngine& operator=(const ActorEngine&) = delete;

  /// Runs `steps` optimizer steps (pipedream: `steps` microbatches, each its own step), reading
  /// microbatches from `data` in order. A failure in any actor (exception, non-finite loss, stall)
  /// stops the whole pipeline and returns an error naming the stage, the microbatch and the
  /// cause; the workers are then in an unspecified state. In a multi-process job every rank
  /// reads its own `data` (at the same position on every rank) and gets the same result; a lost
  /// rank fails the run on every other rank within cluster.peer_timeout, naming it. Spans are
  /// this rank's stages' only. A stop requested through callbacks.stop may end it after fewer
  /// steps (ActorRunResult::stopped; with migration, no check or move follows).
  Expected<ActorRunResult> run(int steps, DataLoader& data, const ActorCallbacks& callbacks = {});

  /// Held-out evaluation between runs: `microbatches` microbatches read from `data`, in order,
  /// pipelined forward through the stages (a forward-only schedule on the same actors and
  /// channels) with each stage's newest weights (StageWorker::evaluate). Nothing a later run
  /// sees changes: no weights, optimizer state, data position of training, or 2bw's previous
  /// version. The losses equal the serial executor's SerialExecutor::evaluate bitwise. In a
  /// job every rank calls it with its own `data` at the same position. eval_spans() keeps the
  /// pass's actions. Errors: a failure in a stage (a non-finite loss, a lost rank) as for run.
  Expected<EvalResult> evaluate(DataLoader& data, int microbatches);
  /// The actions of the last evaluate(), with record_spans (seconds since that pass began).
  const std::vector<ActionSpan>& eval_spans() const { return eval_spans_; }

  const Config& config() const;
  int stages() const;
  /// Which rank runs each stage (one rank for a single process).
  const Placement& placement() const;
  /// This process's rank (0 for a single process).
  int rank() const;
  /// pipeline.replicas: how many pipelines the job runs, and which one this process's stages
  /// belong to (ranks replica·P .. replica·P + P - 1 of a job of replicas·P processes).
  int replicas() const;
  int replica() const;
  /// Whether this process runs stage `stage`: worker(), optimizer() and params() of its layers
  /// are only for local stages.
  bool local(int stage) const;
  /// Stage r's worker (weights, versions), for checkpoints; not during run().
  StageWorker& worker(int stage);
  const StageWorker& worker(int stage) const;
  /// Stage r's optimizer shard (optimizer state), for checkpoints; not during run().
  OptimizerShard& optimizer(int stage);
  const OptimizerShard& optimizer(int stage) const;
  /// Benchmark hook (ActorEngineOptions::slowdown) for the next runs: stage `stage` computes
  /// `factor` times slower (-1 or 1.0: none). Errors: a stage out of range, a factor < 1.
  Status set_slowdown(int stage, double factor);
  /// Current parameters of global layer `layer` (from the stage that holds it), where that
  /// stage is on the host (a CheckFailure for a stage on a device, pipeline.device).
  std::span<const float> params(int layer) const;

 private:
  struct Impl;
  explicit ActorEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::vector<ActionSpan> eval_spans_;
};

/// One call for simple uses: create() the engine, open the configured data, run
/// config.train.steps steps. Final parameters are returned per global layer.
struct ActorTrainResult {
  ActorRunResult run;
  std::vector<std::vector<float>> params;  ///< params[layer]
};
Expected<ActorTrainResult> run_actor_pipeline(const Config& config,
                                              const ActorEngineOptions& options = {},
                                              const ActorCallbacks& callbacks = {});

}  // namespace actorpipe
