// Trainer: the public C++ API of actorpipe. Built from a Config; train() to the configured step
// count (with checkpoints, metrics and trace) or run() a few steps at a time. CAF-free.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "actors/actor_engine.hpp"
#include "engine/checkpoint/safetensors.hpp"
#include "engine/config/config.hpp"
#include "engine/data/data_source.hpp"
#include "engine/expected.hpp"
#include "engine/model/model.hpp"
#include "engine/options.hpp"
#include "engine/stop_flag.hpp"
#include "metrics.hpp"
#include "trace.hpp"

namespace actorpipe {

class ProcessGroup;

/// Which executor runs the pipeline. Both compute the same bits.
enum class Backend : uint8_t {
  actors,  ///< one actor per stage and per optimizer shard plus a driver; stages run concurrently
  serial,  ///< the serial reference executor: every stage in one thread, in a fixed order
};

/// "actors", "serial".
std::string_view to_string(Backend backend);
/// Parses a backend name; the error names the value and the allowed names.
Expected<Backend> parse_backend(std::string_view name);

/// One automatic restart of train() (train.max_restarts), as on_restart() reports it.
struct TrainerRestart {
  int restart = 0;           ///< 1 for the first
  int max_restarts = 0;      ///< train.max_restarts
  std::string error;         ///< the failure it follows
  double waited = 0.0;       ///< seconds waited before it (train.restart_backoff, doubled)
  std::string resumed_from;  ///< the checkpoint it continues from; empty: the start
  int64_t step = 0;          ///< the step it continues from
};

/// Tensors a process's stages sent to stages of other processes (Trainer::transfers()): lent
/// in memory both processes map (cluster.shared_memory, on one host), or copied through UCX.
struct TensorTransfers {
  int64_t lent = 0;
  int64_t copied = 0;
  int64_t bytes_copied = 0;
};

/// How a Trainer runs (never what it computes).
struct TrainerOptions {
  Backend backend = Backend::actors;
  /// actors: threads of the cooperative scheduler, which runs the driver; each stage and each
  /// optimizer shard owns one more thread.
  int scheduler_threads = 1;
  /// Collect trace spans (trace()) even when train.trace is empty. actors backend only.
  bool record_trace = false;
  /// A multi-process job (actors backend): every process of the job creates its Trainer from
  /// the same config with its ProcessGroup (which must outlive the Trainer) and calls the same
  /// methods in the same order. Each runs only its rank's stages (cluster.placement); rank 0
  /// reports steps (on_step, train.metrics, train.trace: its stages' spans); every rank gets
  /// the same losses; checkpoints are written together, each process writing its own layers.
  /// params() and weights() cover the local stages' layers only. Null: one process.
  ProcessGroup* group = nullptr;
  /// Test hooks for the actor engine the Trainer starts with (a restart builds its engine
  /// without them): a fault at one stage and microbatch, and a call on an optimizer shard's
  /// thread before each update (ActorEngineOptions::before_update; it may throw).
  FaultInjection fault;
  std::function<void(int stage, long version)> before_update;
  /// This process is a relaunch of a failed job (actorpipe-launch --max-restarts; the example
  /// trainers fill it from ACTORPIPE_RESTART, ACTORPIPE_MAX_RESTARTS and
  /// ACTORPIPE_RESTART_REASON): create() writes it as a "restart" line of train.metrics after
  /// the resume's line (restart, max_restarts and error are used).
  std::optional<TrainerRestart> relaunched;
  /// A model of your own layers (Model::from_layers, docs/api.md) to train instead of the
  /// built-in GPT or BERT. config.model describes it: vocab_size, context, width, depth (its
  /// hidden layers) and init_seed must equal the model's. pipeline.partition = "auto",
  /// pipeline.recompute = "auto" and migration.enabled profile this model (each time: the
  /// profile cache holds the built-in models'). In a job of several processes every process
  /// passes the same model (the same layers, built the same way).
  std::shared_ptr<const Model> model;
  /// Your own data (DataSource, engine/data/data_source.hpp) instead of [data]: its batch_size()
  /// must be pipeline.microbatch_size, its seq_len() pipeline.seq_len (or model.context), its
  /// vocabulary at most model.vocab_size. Checkpoints keep the position of the next microbatch,
  /// so a resume continues with the same microbatches.
  std::shared_ptr<const DataSource> data;
  /// Held-out data of your own for evaluate() and eval.every (the same shape rules as `data`);
  /// needed when `data` is given. Null: the held-out part of [data] (open_heldout_source).
  std::shared_ptr<const DataSource> eval_data;
};

/// Trains one model as configured. Not thread-safe: one thread calls a Trainer at a time (the
/// step callback runs on that thread too, or on the engine's driver thread while run() blocks).
class Trainer {
 public:
  /// Validates the config, builds the model, its partition into pipeline.stages stages and the
  /// executor, opens the data and, when checkpoint.resume is set, loads that checkpoint
  /// (parameters, optimizer state, update count, data position; the pipeline may have another
  /// number of stages). Opens train.metrics (appending when resuming; a relaunch that starts
  /// over keeps the earlier restarts' lines). Errors name the key or
  /// file at fault, the value and what is allowed, or what does not match in a checkpoint.
  /// pipeline.partition = "auto" is resolved first: the planner's partition from a measured (or
  /// cached, docs/planner.md) layer profile; config() and partition() then hold its counts.
  static Expected<std::unique_ptr<Trainer>> create(const Config& config,
                                                   const TrainerOptions& options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Called after every optimizer step, in order, with that step's metrics.
  void on_step(std::function<void(const StepMetrics&)> callback);
  /// Called for every verdict of the migration manager (docs/migration.md): each forced move
  /// and each check of the automatic rule, moved or not, between two steps of a run. Each is
  /// also a line {"migration": ...} of train.metrics, and each move an instant event of the
  /// trace; after a move, partition() and the checkpoints' manifests name the new layout.
  void on_migration(std::function<void(const MigrationEvent&)> callback);

  /// Held-out evaluation now, between runs: a forward-only pass through the pipeline (the same
  /// actors and channels as training; the serial backend: stage by stage) over the first
  /// eval.microbatches microbatches of the held-out data, the same ones every time, with the
  /// weights a user would keep: the newest, i.e. those the next step starts from (gpipe, 1f1b:
  /// the current ones; 2bw, pipedream, xpipe: the newest committed version, at a run boundary
  /// every update is committed). Changes nothing training sees. Writes an {"eval": ...} line to
  /// train.metrics, an instant event and the pass's actions to the trace, and calls on_eval.
  /// In a job every process calls it; every process gets the same result.
  /// Held-out data: TrainerOptions::eval_data, else eval.path, else the held-out part of [data]
  /// (data.holdout of a file; the synthetic corpus's own stream): errors name the key.
  Expected<EvalMetrics> evaluate();
  /// Called after every evaluation (evaluate(), and eval.every during train()).
  void on_eval(std::function<void(const EvalMetrics&)> callback);
  /// The last evaluation's metrics, if any.
  const std::optional<EvalMetrics>& last_eval() const;

  /// Trains until train.steps steps are done (counting those before a resume). With
  /// checkpoint.dir set, the steps run in pipeline runs that end at multiples of
  /// checkpoint.every (a checkpoint <dir>/step-<N> after each) and <dir>/final is written at the
  /// end; then the trace goes to train.trace. Every step appends a line to train.metrics.
  /// With eval.every > 0 runs also end at its multiples, each followed by evaluate(), and the
  /// last step is evaluated too (in pipedream and xpipe a run boundary changes the bits: see
  /// docs/modes.md). With train.max_restarts > 0 (one process) a failed run is restarted: the
  /// pipeline is rebuilt from the latest complete checkpoint in checkpoint.dir (or from the start,
  /// or checkpoint.resume, when it holds none) after train.restart_backoff seconds (doubled each
  /// time), the metrics file drops the replayed steps' lines and gets a "restart" line, and the
  /// training goes on (on_restart(), restarts()); the result equals an uninterrupted train()
  /// bitwise. Past the limit the error is the last failure's. When a restart itself fails
  /// (the checkpoint directory gone, say) the error says so and the trainer holds no pipeline
  /// any more: only config() and destruction are safe then.
  /// After request_stop() it returns early without an error: stopped() is true, the checkpoint
  /// of the step it stopped at is written (checkpoint.dir set; last_checkpoint()), a line
  /// {"stopped": ...} ends train.metrics and the trace is written.
  Status train();

  /// Asks train(), or the run() in progress, to end after the step in flight. gpipe, 1f1b and
  /// 2bw end the pipeline run right after the step being fed (every stage finishes that step, no
  /// later microbatch is read; 2bw's next run continues it exactly). pipedream and xpipe do the
  /// same with train.stop = "step" (their pipeline drains there, where the uninterrupted
  /// training does not), and with "run" end at the end of the current pipeline run (a multiple
  /// of checkpoint.every when checkpoint.dir is set, else train.steps), where the uninterrupted
  /// training also drains. Safe from any thread and from a signal handler (it sets lock-free
  /// atomics only); `signal` is the signal that asked, for the messages (0: the program). The
  /// request stays: a later train() or run() returns after at most one step. In a job of several
  /// processes rank 0's request decides, and every rank stops after the same step.
  void request_stop(int signal = 0) noexcept;
  /// train() or run() ended early on request_stop(); step_count() says after which step.
  bool stopped() const;
  /// The tensors this process's stages sent to stages of other processes so far (a job of
  /// several processes; zero in one process).
  const TensorTransfers& transfers() const;
  /// The signal of the first request_stop() (0: the program asked), -1 when none came.
  int stop_signal() const;
  /// The checkpoint train() (or save()) wrote last, or empty.
  const std::string& last_checkpoint() const;
  /// Called for each automatic restart of train(), after the pipeline is rebuilt.
  void on_restart(std::function<void(const TrainerRestart&)> callback);
  /// Automatic restarts train() has done.
  int restarts() const;

  /// Runs `steps` more optimizer steps as one pipeline run (async modes fill the pipeline at its
  /// start and drain it at its end) and returns the last step's metrics. No checkpoint. After
  /// request_stop() the run may end after fewer steps (stopped()).
  Expected<StepMetrics> run(int steps);
  /// run(1).
  Expected<StepMetrics> step() { return run(1); }

  /// Writes a checkpoint of the current state to <dir>/step-<N> (N = step_count()), or to
  /// <dir>/final, and returns its path.
  Expected<std::string> save(const std::string& dir, bool final = false);

  /// Spans of every action run so far (train.trace set or TrainerOptions::record_trace).
  std::span<const TraceSpan> trace() const;
  /// Writes trace() as a Chrome / Perfetto trace.
  Status write_trace(const std::string& path) const;

  const Config& config() const;
  Backend backend() const;
  /// Optimizer steps done, counting those before a resume.
  int64_t step_count() const;
  /// Metrics of the last step run (step_count() and zeros before any step).
  const StepMetrics& last_metrics() const;
  int stages() const;
  /// Layers of each stage, in order (they sum to num_layers()).
  std::vector<int> partition() const;
  /// Layers of the model: embedding, model.depth blocks, head.
  int num_layers() const;
  /// Trainable parameters (a tied parameter counted once).
  int64_t parameter_count() const;
  /// What this process's stages compute on (pipeline.device): "CPU", or each stage's backend
  /// ("stage 0: cuda:0 (NVIDIA H100 ...), stage 1: ...").
  std::string devices() const;
  /// Current parameters of global layer `layer`: one contiguous buffer, laid out by the layer's
  /// parameter slots (see weights() for names and shapes). In a multi-process job only for the
  /// layers of this process's stages (holds_layer()); with the stages off the host
  /// (pipeline.device) a CheckFailure: weights() copies them out.
  std::span<const float> params(int layer) const;
  /// Whether this process holds global layer `layer` (always, in a single process).
  bool holds_layer(int layer) const;
  /// Every parameter tensor under its checkpoint name ("layers.3.attn.qkv.weight"), with its
  /// shape and a copy of its current values, in layer and slot order (this process's layers).
  std::vector<NamedTensor> weights() const;
  /// One line describing the data source (kind, file or chain, sizes).
  std::string data_description() const;
  /// The lowest achievable mean loss of the data, when known (GPT on the synthetic corpus: its
  /// entropy rate in nats/token).
  std::optional<double> loss_floor() const;
  /// The checkpoint this trainer resumed from, or empty.
  const std::string& resumed_from() const;
  /// Resumed from a directory of checkpoints: the newer ones that did not load (damaged or
  /// incomplete), newest first, each naming the file and why; the run continues from
  /// resumed_from().
  const std::vector<std::string>& skipped_checkpoints() const;

 private:
  struct Impl;
  explicit Trainer(std::unique_ptr<Impl> impl);
  Status train_once();
  // create(); `after_failure`: a restart in this process, which keeps train.metrics' earlier
  // lines as a relaunch does
  static Expected<std::unique_ptr<Trainer>> create(const Config& config,
                                                   const TrainerOptions& options,
                                                   bool after_failure);
  // rebuilds impl_ from the latest checkpoint after a failure (restart `restart`)
  Status restart_from_checkpoint(int restart, const std::string& error, double waited);
  std::unique_ptr<Impl> impl_;
  StopFlag stop_;  // here, not in impl_: a signal handler may set it while a restart replaces impl_
};

}  // namespace actorpipe
