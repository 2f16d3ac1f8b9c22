// Trainer: owns the executor (actor engine or serial executor), the data loader and the run's
// bookkeeping (step count, tokens, time, stage times, spans); checkpoints between runs.
#include "actors/api/actorpipe/trainer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>

#include "actors/actor_engine.hpp"
#include "actors/job_plan.hpp"
#include "actors/process_group.hpp"
#include "actors/supervisor.hpp"
#include "engine/checkpoint/checkpoint.hpp"
#include "engine/checkpoint/checkpoint_dir.hpp"
#include "engine/checkpoint/pipeline_checkpoint.hpp"
#include "engine/data/loader.hpp"
#include "engine/execution/optimizer_shard.hpp"
#include "engine/execution/replicated_executor.hpp"
#include "engine/execution/serial_executor.hpp"
#include "engine/execution/stage_worker.hpp"
#include "engine/mode.hpp"
#include "engine/profiler/auto_partition.hpp"
#include "engine/stop_flag.hpp"
#include "kernels/backend_memory.hpp"
#include "kernels/check.hpp"

namespace actorpipe {
namespace {

// Whether `path` can be written, found out without changing it: opened for appending (nothing
// is written), and removed again when the probe created it.
Status probe_writable(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return make_error("is a directory");
  const bool existed = std::filesystem::exists(path, ec);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return make_error("cannot open for writing: {}", std::strerror(errno));
  ::close(fd);
  if (!existed) ::unlink(path.c_str());
  return {};
}

using Clock = std::chrono::steady_clock;

int sequence_length(const Config& c) {
  return c.pipeline.seq_len > 0 ? c.pipeline.seq_len : c.model.context;
}

// What an executor reports after each step of a run; times are relative to the run's start.
struct RunStep {
  int step = 0;  // 1-based within the run
  double loss = 0.0;
  int64_t tokens = 0;  // within the run
  double seconds = 0.0;
  std::vector<StageTimes> stages;  // cumulative within the run; empty when not measured
  bool skipped = false;            // dropped on every stage (train.nonfinite = "skip")
};

struct RunOutput {
  std::vector<double> losses;
  std::vector<StageTimes> stages;
  std::vector<ActionSpan> spans;
  std::vector<ActionSpan> update_spans;  ///< the optimizer shards' updates
  std::vector<ReduceSpan> reduce_spans;  ///< the all-reduces over the replicas
  int64_t tokens = 0;
  bool stopped = false;       ///< a stop was asked: losses.size() steps ran, maybe fewer than asked
  TensorTransfers transfers;  ///< to stages of other processes
};

using RunStepFn = std::function<void(const RunStep&)>;
using MigrationFn = std::function<void(const MigrationEvent&, double seconds)>;

// The two ways to run the pipeline, behind one small interface.
class Executor {
 public:
  virtual ~Executor() = default;
  virtual int stages() const = 0;
  /// True when runs report per-stage busy and idle time.
  virtual bool measures_stages() const = 0;
  /// Whether this process runs stage `stage` (always, in a single process).
  virtual bool local(int stage) const = 0;
  virtual StageWorker& worker(int stage) = 0;
  virtual const StageWorker& worker(int stage) const = 0;
  virtual OptimizerShard& optimizer(int stage) = 0;
  /// on_migration: every verdict of the migration manager, with seconds since the run started.
  /// `stop` requested: the run may end early (Trainer::request_stop).
  virtual Expected<RunOutput> run(int steps, DataLoader& data, const RunStepFn& on_step,
                                  const MigrationFn& on_migration, const StopFlag& stop) = 0;
  /// A held-out evaluation of `microbatches` from `data` between runs; `spans` gets its actions
  /// (seconds since it began) when the executor records them.
  virtual Expected<EvalResult> evaluate(DataLoader& data, int microbatches,
                                        std::vector<ActionSpan>& spans) = 0;
  /// pipeline.replicas: which replica this process's stages belong to (only replica 0 writes
  /// their tensors into a checkpoint: the others hold the same bits).
  virtual int replica() const { return 0; }
  /// Copies of the pipeline this process holds (the serial backend holds every replica): a
  /// resume loads each; copy 0 is worker()/optimizer().
  virtual int copies() const { return 1; }
  virtual StageWorker& copy_worker(int copy, int stage) {
    AP_CHECK(copy == 0, "copy {} of 1", copy);
    return worker(stage);
  }
  virtual OptimizerShard& copy_optimizer(int copy, int stage) {
    AP_CHECK(copy == 0, "copy {} of 1", copy);
    return optimizer(stage);
  }
};

class ActorsExecutor final : public Executor {
 public:
  // stop_drains: train.stop = "step" (pipedream and xpipe end after the step in flight too)
  ActorsExecutor(std::unique_ptr<ActorEngine> engine, bool stop_drains)
      : engine_(std::move(engine)), stop_drains_(stop_drains) {}
  int stages() const override { return engine_->stages(); }
  bool measures_stages() const override { return true; }
  bool local(int r) const override { return engine_->local(r); }
  StageWorker& worker(int r) override { return engine_->worker(r); }
  const StageWorker& worker(int r) const override { return engine_->worker(r); }
  OptimizerShard& optimizer(int r) override { return engine_->optimizer(r); }
  int replica() const override { return engine_->replica(); }

  Expected<RunOutput> run(int steps, DataLoader& data, const RunStepFn& on_step,
                          const MigrationFn& on_migration, const StopFlag& stop) override {
    const auto t0 = Clock::now();
    ActorCallbacks callbacks;
    callbacks.stop = &stop;
    callbacks.stop_drains = stop_drains_;
    callbacks.on_step = [&](const StepProgress& p) {
      on_step(RunStep{p.step, p.loss, p.tokens, p.seconds, p.stages, p.skipped});
    };
    callbacks.on_migration = [&](const MigrationEvent& e) {
      on_migration(e, std::chrono::duration<double>(Clock::now() - t0).count());
    };
    auto r = engine_->run(steps, data, callbacks);
    if (!r) return r.error();
    return RunOutput{std::move(r->losses),
                     std::move(r->stages),
                     std::move(r->spans),
                     std::move(r->update_spans),
                     std::move(r->reduce_spans),
                     r->tokens,
                     r->stopped,
                     TensorTransfers{r->tensors_lent, r->tensors_copied, r->bytes_copied}};
  }

  Expected<EvalResult> evaluate(DataLoader& data, int microbatches,
                                std::vector<ActionSpan>& spans) override {
    auto r = engine_->evaluate(data, microbatches);
    if (r) spans = engine_->eval_spans();
    return r;
  }

 private:
  std::unique_ptr<ActorEngine> engine_;
  bool stop_drains_;
};

// Whether a run of `mode` may end after any step with the bits of the uninterrupted run (a stop
// then ends it after the step in flight).
bool ends_between_steps(Mode mode) {
  return is_synchronous(mode) || mode == Mode::twobw;
}

// The serial executor measures no stage times. It reports each step once every stage has
// committed its update (SerialExecutor::StepDone), also inside the one long schedule of an
// asynchronous mode. gpipe, 1f1b and 2bw run step by step (the same bits as one run: each step
// of gpipe and 1f1b is its own schedule, and a 2bw run continues the previous one exactly), so a
// stop ends the run after the step in flight; pipedream and xpipe run their one schedule, which
// a stop cuts after the step in flight with `stop_drains` (train.stop = "step": they drain
// there) and else runs to its end (a drain the uninterrupted training has too).
class SerialBackend final : public Executor {
 public:
  SerialBackend(std::unique_ptr<SerialExecutor> exec, int64_t tokens_per_microbatch,
                bool stop_drains)
      : exec_(std::move(exec)), tokens_per_mb_(tokens_per_microbatch), stop_drains_(stop_drains) {}
  int stages() const override { return exec_->stages(); }
  bool measures_stages() const override { return false; }
  bool local(int) const override { return true; }
  StageWorker& worker(int r) override { return exec_->worker(r); }
  const StageWorker& worker(int r) const override { return exec_->worker(r); }
  OptimizerShard& optimizer(int r) override { return exec_->optimizer(r); }

  Expected<RunOutput> run(int steps, DataLoader& data, const RunStepFn& on_step, const MigrationFn&,
                          const StopFlag& stop) override {
    const auto t0 = Clock::now();
    auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    RunOutput out;
    const bool stepwise = ends_between_steps(exec_->options().mode);
    const int per_run = stepwise ? 1 : steps;
    const StopFlag* cut = !stepwise && stop_drains_ ? &stop : nullptr;
    for (int done = 0; done < steps; done += per_run) {
      if (done > 0 && stop.requested()) break;
      auto losses = exec_->run(
          per_run, data,
          [&](int step, double loss) {
            out.losses.push_back(loss);
            out.tokens = exec_->microbatches_for(done + step) * tokens_per_mb_;
            // the executor counts a dropped step before it reports it
            const bool skipped = exec_->skipped_steps() > skipped_;
            skipped_ = exec_->skipped_steps();
            on_step(RunStep{done + step, loss, out.tokens, since(), {}, skipped});
          },
          cut);
      if (!losses) return losses.error();
      AP_CHECK(static_cast<size_t>(done) + losses->size() == out.losses.size(),
               "serial backend: {} steps reported, {} run", out.losses.size(),
               static_cast<size_t>(done) + losses->size());
    }
    out.stopped = stop.requested();
    return out;
  }

  Expected<EvalResult> evaluate(DataLoader& data, int microbatches,
                                std::vector<ActionSpan>& spans) override {
    spans.clear();
    return exec_->evaluate(data, microbatches);
  }

 private:
  std::unique_ptr<SerialExecutor> exec_;
  int64_t tokens_per_mb_;
  bool stop_drains_;
  int64_t skipped_ = 0;  // exec_->skipped_steps() at the last step reported
};

// pipeline.replicas in one process: every replica's serial executor (ReplicatedExecutor), the
// reference of a replicated job. gpipe, 1f1b and 2bw run step by step, as SerialBackend.
class ReplicatedBackend final : public Executor {
 public:
  ReplicatedBackend(std::unique_ptr<ReplicatedExecutor> exec, int64_t tokens_per_microbatch)
      : exec_(std::move(exec)), tokens_per_mb_(tokens_per_microbatch) {}
  int stages() const override { return first().stages(); }
  bool measures_stages() const override { return false; }
  bool local(int) const override { return true; }
  StageWorker& worker(int r) override { return exec_->replica(0).worker(r); }
  const StageWorker& worker(int r) const override { return first().worker(r); }
  OptimizerShard& optimizer(int r) override { return exec_->replica(0).optimizer(r); }
  int copies() const override { return exec_->replicas(); }
  StageWorker& copy_worker(int copy, int r) override { return exec_->replica(copy).worker(r); }
  OptimizerShard& copy_optimizer(int copy, int r) override {
    return exec_->replica(copy).optimizer(r);
  }

  Expected<RunOutput> run(int steps, DataLoader& data, const RunStepFn& on_step, const MigrationFn&,
                          const StopFlag& stop) override {
    const auto t0 = Clock::now();
    auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    RunOutput out;
    const bool stepwise = ends_between_steps(first().options().mode);
    const int per_run = stepwise ? 1 : steps;
    const int64_t job_mbs = exec_->split().microbatches;  // per step, all replicas
    for (int done = 0; done < steps; done += per_run) {
      if (done > 0 && stop.requested()) break;
      auto losses = exec_->run(per_run, data);
      if (!losses) return losses.error();
      for (size_t i = 0; i < losses->size(); ++i) {
        const int step = done + static_cast<int>(i) + 1;
        out.losses.push_back((*losses)[i]);
        out.tokens = step * job_mbs * tokens_per_mb_;
        const bool skipped = first().skipped_steps() > skipped_;
        skipped_ = first().skipped_steps();
        on_step(RunStep{step, (*losses)[i], out.tokens, since(), {}, skipped});
      }
    }
    out.stopped = stop.requested();
    return out;
  }

  Expected<EvalResult> evaluate(DataLoader& data, int microbatches,
                                std::vector<ActionSpan>& spans) override {
    spans.clear();  // every replica holds the same weights: one evaluates
    return exec_->replica(0).evaluate(data, microbatches);
  }

 private:
  const SerialExecutor& first() const { return exec_->replica(0); }
  std::unique_ptr<ReplicatedExecutor> exec_;
  int64_t tokens_per_mb_;
  int64_t skipped_ = 0;
};

// A user's data source must make the microbatches the config's pipeline takes.
Status check_own_data(const DataSource& data, const Config& config, int B, int T) {
  if (data.batch_size() != B) {
    return make_error("makes microbatches of {} sequences, but pipeline.microbatch_size = {}",
                      data.batch_size(), B);
  }
  if (data.seq_len() != T) {
    return make_error("makes sequences of {} tokens, but the pipeline takes {} ({})",
                      data.seq_len(), T,
                      config.pipeline.seq_len > 0 ? "pipeline.seq_len" : "model.context");
  }
  if (data.vocab_size() < 1 || data.vocab_size() > config.model.vocab_size) {
    return make_error("has vocabulary {}, expected 1 .. model.vocab_size = {}", data.vocab_size(),
                      config.model.vocab_size);
  }
  return {};
}

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};

}  // namespace

std::string_view to_string(Backend backend) {
  return backend == Backend::serial ? "serial" : "actors";
}

Expected<Backend> parse_backend(std::string_view name) {
  if (name == "actors") return Backend::actors;
  if (name == "serial") return Backend::serial;
  return make_error("backend \"{}\": unknown (allowed: actors, serial)", name);
}

struct Trainer::Impl {
  Config config;
  TrainerOptions options;
  std::unique_ptr<Executor> exec;
  std::unique_ptr<DataLoader> data;
  std::shared_ptr<const DataSource> heldout;  // opened at the first evaluation (or create())
  std::unique_ptr<std::FILE, FileCloser> metrics;
  std::function<void(const EvalMetrics&)> eval_callback;
  std::optional<EvalMetrics> last_eval;
  std::function<void(const StepMetrics&)> callback;
  std::function<void(const MigrationEvent&)> migration_callback;
  std::function<void(const TrainerRestart&)> restart_callback;
  int restarts = 0;           // automatic restarts of train()
  int64_t skipped_steps = 0;  // steps dropped (train.nonfinite = "skip") since the start
  bool record_spans = false;
  std::string resumed_from;
  std::vector<std::string> skipped_checkpoints;  // newer ones the resume passed over, and why
  CheckpointDirLock checkpoint_lock;             // held while this trainer may write checkpoint.dir
  bool stopped = false;                          // the last train() or run() ended on it
  std::string last_checkpoint;
  int64_t checkpoint_step = -1;  // the step of last_checkpoint when it is a step-<N> one

  int64_t step = 0;           // optimizer steps done, counting those before a resume
  int64_t first_step = 0;     // step when this trainer started
  int64_t tokens = 0;         // consumed by finished runs
  TensorTransfers transfers;  // to other processes, in finished runs
  std::optional<Clock::time_point> train_start;
  std::vector<StageMetrics> stage_totals;  // of finished runs
  std::vector<TraceSpan> spans;
  std::vector<TraceMark> marks;  // the moves, for the trace
  StepMetrics last;
  Status callback_status;  // the first failure inside a step report (a metrics write)

  bool multi() const { return options.group != nullptr && options.group->world() > 1; }
  // The held-out data of [data] (eval.path, data.holdout) unless it is open already (or given:
  // TrainerOptions::eval_data). One's own training data has no held-out part of [data].
  Status open_heldout() {
    if (heldout) return {};
    if (options.data) {
      return make_error(
          "the training data is your own (TrainerOptions::data), so the held-out data must be "
          "too: set TrainerOptions::eval_data");
    }
    auto held = open_heldout_source(config.data, config.eval.path, config.model.arch,
                                    config.model.vocab_size, config.pipeline.microbatch_size,
                                    sequence_length(config));
    if (!held) return held.error();
    heldout = std::move(*held);
    return {};
  }
  // tokens of one optimizer step (pipedream: one microbatch)
  int64_t tokens_per_step() const {
    const int64_t mbs = config.pipeline.mode == "pipedream" ? 1 : config.pipeline.microbatches;
    return mbs * config.pipeline.microbatch_size * sequence_length(config);
  }
  // Appends `line` to train.metrics (when open and nothing failed before); the first failure
  // is kept in callback_status.
  void write_metrics(const std::string& line) {
    if (!metrics || !callback_status.ok()) return;
    const std::string text = line + "\n";
    if (std::fwrite(text.data(), 1, text.size(), metrics.get()) != text.size() ||
        std::fflush(metrics.get()) != 0) {
      callback_status = make_error("train.metrics = \"{}\": write failed: {}", config.train.metrics,
                                   std::strerror(errno));
    }
  }
  // this process's stages' workers and shards, in stage order
  std::vector<StageWorker*> workers() {
    std::vector<StageWorker*> w;
    for (int r = 0; r < exec->stages(); ++r)
      if (exec->local(r)) w.push_back(&exec->worker(r));
    return w;
  }
  std::vector<OptimizerShard*> optimizers() {
    std::vector<OptimizerShard*> o;
    for (int r = 0; r < exec->stages(); ++r)
      if (exec->local(r)) o.push_back(&exec->optimizer(r));
    return o;
  }
  const StageWorker& any_worker() const {
    for (int r = 0; r < exec->stages(); ++r)
      if (exec->local(r)) return exec->worker(r);
    AP_CHECK(false, "this process holds no stage");
    return exec->worker(0);
  }
  const Partition& partition() const { return any_worker().partition(); }
  const Model& model() const { return any_worker().model(); }
};

Trainer::Trainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Trainer::~Trainer() = default;

Expected<std::unique_ptr<Trainer>> Trainer::create(const Config& config,
                                                   const TrainerOptions& options) {
  return create(config, options, false);
}

Expected<std::unique_ptr<Trainer>> Trainer::create(const Config& config,
                                                   const TrainerOptions& options,
                                                   bool after_failure) {
  if (Status ok = validate(config); !ok) return ok.error();
  if (options.scheduler_threads < 1) {
    return make_error("trainer: scheduler_threads = {}, expected >= 1", options.scheduler_threads);
  }
  Config given = config;
  if (options.model) {
    // a model of the user's own layers, which config.model describes
    auto declared = options_for_model(config.model, *options.model);
    if (!declared) return make_error("TrainerOptions::model: {}", declared.error().message);
    given.model = *declared;
  }
  // "auto": the planner's partition from the measured (or cached) profile, for both backends
  // and for the checkpoints' manifests
  // in a job rank 0 plans and every process takes its plan (pipeline.replicas = 0 too)
  AutoPartitionOptions planning;
  planning.model = options.model.get();
  auto resolved = plan_job(given, options.group, planning);
  if (!resolved) return resolved.error();
  auto impl = std::make_unique<Impl>();
  impl->config = *resolved;
  impl->options = options;
  impl->record_spans = options.record_trace || !config.train.trace.empty();
  if ((config.migration.enabled || !config.migration.moves.empty()) &&
      options.backend == Backend::serial) {
    return make_error(
        "migration.{}: the serial backend has no migration manager (use the actors backend)",
        config.migration.enabled ? "enabled = true" : "moves");
  }
  if (impl->record_spans && options.backend == Backend::serial) {
    const std::string what = config.train.trace.empty()
                                 ? std::string("TrainerOptions::record_trace")
                                 : fmt::format("train.trace = \"{}\"", config.train.trace);
    return make_error("{}: the serial backend records no trace (use the actors backend)", what);
  }
  const int B = config.pipeline.microbatch_size;
  const int T = sequence_length(config);
  const bool stop_drains = config.train.stop == "step";
  if (options.group != nullptr && options.group->world() > 1 &&
      options.backend != Backend::actors) {
    return make_error("a job of {} processes runs the actors backend, not {}",
                      options.group->world(), to_string(options.backend));
  }
  if (options.backend == Backend::actors) {
    ActorEngineOptions eo;
    eo.scheduler_threads = options.scheduler_threads;
    eo.record_spans = impl->record_spans;
    eo.fault = options.fault;
    eo.before_update = options.before_update;
    eo.model = options.model;
    if (options.group != nullptr) {
      eo.stall_timeout_seconds =
          std::max(eo.stall_timeout_seconds,
                   std::chrono::duration<double>(options.group->options().peer_timeout).count());
    }
    auto engine = ActorEngine::create(impl->config, eo, options.group);
    if (!engine) return engine.error();
    impl->exec = std::make_unique<ActorsExecutor>(std::move(*engine), stop_drains);
  } else if (impl->config.pipeline.replicas > 1) {
    auto exec = ReplicatedExecutor::create(impl->config, options.model.get());
    if (!exec) return exec.error();
    impl->exec = std::make_unique<ReplicatedBackend>(std::move(*exec), int64_t{B} * T);
  } else {
    auto exec = SerialExecutor::create(impl->config, false, options.model.get());
    if (!exec) return exec.error();
    impl->exec = std::make_unique<SerialBackend>(std::move(*exec), int64_t{B} * T, stop_drains);
  }
  if (options.data) {
    if (Status ok = check_own_data(*options.data, config, B, T); !ok)
      return make_error("TrainerOptions::data ({}): {}", options.data->describe(),
                        ok.error().message);
    impl->data = DataLoader::over(options.data);
  } else {
    auto data = DataLoader::open(config.data, config.model.arch, config.model.vocab_size, B, T);
    if (!data) return data.error();
    impl->data = std::move(*data);
  }

  if (options.eval_data) {
    if (Status ok = check_own_data(*options.eval_data, config, B, T); !ok)
      return make_error("TrainerOptions::eval_data ({}): {}", options.eval_data->describe(),
                        ok.error().message);
    impl->heldout = options.eval_data;
  } else if (config.eval.every > 0) {
    // what would fail at the first evaluation fails now
    if (Status ok = impl->open_heldout(); !ok)
      return make_error("eval.every = {}: {}", config.eval.every, ok.error().message);
  }
  if (!config.checkpoint.resume.empty()) {
    auto ckpt = load_checkpoint(config.checkpoint.resume);
    if (!ckpt) return make_error("checkpoint.resume: {}", ckpt.error().message);
    if (Status ok = check_resume(ckpt->info, impl->config); !ok) {
      return make_error("checkpoint.resume = \"{}\" ({}): {}", config.checkpoint.resume, ckpt->path,
                        ok.error().message);
    }
    // every copy of the pipeline this process holds (the serial backend's replicas)
    for (int c = 0; c < impl->exec->copies(); ++c) {
      std::vector<StageWorker*> workers;
      std::vector<OptimizerShard*> optimizers;
      for (int r = 0; r < impl->exec->stages(); ++r) {
        if (!impl->exec->local(r)) continue;
        workers.push_back(&impl->exec->copy_worker(c, r));
        optimizers.push_back(&impl->exec->copy_optimizer(c, r));
      }
      if (Status ok = load_pipeline_checkpoint(*ckpt, workers, optimizers); !ok) {
        return make_error("checkpoint.resume = \"{}\": {}", config.checkpoint.resume,
                          ok.error().message);
      }
    }
    impl->data->seek(ckpt->info.data_position);
    impl->step = ckpt->info.step;
    impl->first_step = ckpt->info.step;
    impl->resumed_from = ckpt->path;
    impl->skipped_checkpoints = ckpt->skipped;
  }
  impl->last.step = impl->step;
  impl->last.steps = config.train.steps;
  impl->last.first_step = impl->first_step;
  if (impl->exec->measures_stages()) {
    impl->stage_totals.assign(static_cast<size_t>(impl->exec->stages()), StageMetrics{});
  }
  impl->last.stages = impl->stage_totals;

  const bool reports = options.group == nullptr || options.group->rank() == 0;
  // preflight: what would fail at the first checkpoint or at the end fails now
  if (!config.checkpoint.dir.empty() && reports) {
    CheckpointDirPlan plan;
    plan.dir = config.checkpoint.dir;
    plan.overwrite = config.checkpoint.overwrite;
    std::error_code ec;
    plan.resuming_here =
        !impl->resumed_from.empty() &&
        std::filesystem::equivalent(std::filesystem::path(impl->resumed_from).parent_path(),
                                    config.checkpoint.dir, ec);
    auto workers = impl->workers();
    auto optimizers = impl->optimizers();
    // this process's stages (the whole checkpoint unless the job has several processes)
    if (auto bytes = pipeline_checkpoint_bytes(workers, optimizers)) plan.checkpoint_bytes = *bytes;
    auto lock = prepare_checkpoint_dir(plan);
    if (!lock) return lock.error();
    impl->checkpoint_lock = std::move(*lock);
  }
  if (!config.train.trace.empty() && reports) {
    if (Status ok = probe_writable(config.train.trace); !ok)
      return make_error("train.trace = \"{}\": {}", config.train.trace, ok.error().message);
  }
  if (!config.train.metrics.empty() && reports) {
    // a resumed run continues the file it most likely wrote before, without the steps it
    // replays; a restart or relaunch that starts over keeps the earlier restarts' lines
    const bool resumed = !impl->resumed_from.empty();
    const bool restarted = after_failure || options.relaunched.has_value();
    if (resumed) {
      auto dropped = resume_metrics_file(config.train.metrics, impl->step, impl->resumed_from);
      if (!dropped) return dropped.error();
    } else if (restarted) {
      auto dropped = restart_metrics_file(config.train.metrics);
      if (!dropped) return dropped.error();
    }
    const char* mode = resumed || restarted ? "a" : "w";
    std::FILE* f = std::fopen(config.train.metrics.c_str(), mode);
    if (!f) {
      return make_error("train.metrics = \"{}\": cannot open for writing: {}", config.train.metrics,
                        std::strerror(errno));
    }
    impl->metrics.reset(f);
    if (const auto& r = options.relaunched) {
      impl->write_metrics(
          restart_json(impl->step, r->restart, r->max_restarts, impl->resumed_from, r->error));
      if (!impl->callback_status.ok()) return impl->callback_status.error();
    }
  }
  return std::unique_ptr<Trainer>(new Trainer(std::move(impl)));
}

void Trainer::on_step(std::function<void(const StepMetrics&)> callback) {
  impl_->callback = std::move(callback);
}

void Trainer::on_migration(std::function<void(const MigrationEvent&)> callback) {
  impl_->migration_callback = std::move(callback);
}

void Trainer::on_eval(std::function<void(const EvalMetrics&)> callback) {
  impl_->eval_callback = std::move(callback);
}

const std::optional<EvalMetrics>& Trainer::last_eval() const {
  return impl_->last_eval;
}

Expected<EvalMetrics> Trainer::evaluate() {
  Impl& im = *impl_;
  if (Status ok = im.open_heldout(); !ok) return make_error("evaluate: {}", ok.error().message);
  const auto now = Clock::now();
  if (!im.train_start) im.train_start = now;
  const double offset = std::chrono::duration<double>(now - *im.train_start).count();
  // the first eval.microbatches held-out microbatches, the same every time
  auto data = DataLoader::over(im.heldout);
  std::vector<ActionSpan> spans;
  auto r = im.exec->evaluate(*data, im.config.eval.microbatches, spans);
  if (!r) return make_error("the evaluation after step {}: {}", im.step, r.error().message);
  EvalMetrics m;
  m.step = im.step;
  m.loss = r->loss;
  m.microbatches = r->microbatches;
  m.tokens = r->tokens;
  m.seconds = r->seconds;
  im.last_eval = m;
  if (im.record_spans) {
    for (const ActionSpan& s : spans) {
      TraceSpan t{s.stage, s.action, offset + s.start, offset + s.end};
      t.eval = true;
      im.spans.push_back(t);
    }
    TraceMark mark;
    mark.at = offset + r->seconds;
    mark.name = fmt::format("eval after step {}: loss {:.4f}", m.step, m.loss);
    mark.detail = fmt::format("{} held-out microbatches, {} tokens, {} ({})", m.microbatches,
                              m.tokens, im.heldout->describe(), im.config.pipeline.mode);
    mark.category = "eval";
    im.marks.push_back(std::move(mark));
  }
  im.callback_status = {};
  im.write_metrics(eval_json(m));
  if (im.eval_callback) im.eval_callback(m);
  if (!im.callback_status.ok()) return im.callback_status.error();
  return m;
}

Expected<StepMetrics> Trainer::run(int steps) {
  Impl& im = *impl_;
  if (steps < 1) return make_error("trainer: run({}) steps, expected >= 1", steps);
  const auto now = Clock::now();
  if (!im.train_start) im.train_start = now;
  const double offset = std::chrono::duration<double>(now - *im.train_start).count();
  const int64_t base_step = im.step;
  const int64_t target = std::max<int64_t>(im.config.train.steps, base_step + steps);
  im.callback_status = {};

  auto report = [&](const RunStep& rs) {
    StepMetrics m;
    m.step = base_step + rs.step;
    m.steps = target;
    m.first_step = im.first_step;
    m.loss = rs.loss;
    m.tokens = im.tokens + rs.tokens;
    m.seconds = offset + rs.seconds;
    m.stages = im.stage_totals;
    m.skipped = rs.skipped;
    if (rs.skipped) ++im.skipped_steps;
    m.skipped_steps = im.skipped_steps;
    for (size_t r = 0; r < rs.stages.size() && r < m.stages.size(); ++r) {
      m.stages[r].busy_seconds += rs.stages[r].busy_seconds;
      m.stages[r].idle_seconds += rs.stages[r].idle_seconds;
    }
    im.write_metrics(metrics_json(m));
    im.last = m;
    if (im.callback) im.callback(m);
  };

  auto migrated = [&](const MigrationEvent& e, double seconds) {
    im.write_metrics(migration_json(e));
    if (e.moved) {
      im.marks.push_back(TraceMark{
          offset + seconds,
          fmt::format("migration [{}] -> [{}]", fmt::join(e.from, ", "), fmt::join(e.to, ", ")),
          e.reason});
      // checkpoints record the layout the stages hold
      im.config.pipeline.partition.automatic = false;
      im.config.pipeline.partition.counts = e.to;
    }
    if (im.migration_callback) im.migration_callback(e);
  };
  im.stopped = false;
  auto out = im.exec->run(steps, *im.data, report, migrated, stop_);
  if (!out) {
    return make_error("the run of steps {} to {}: {}", base_step + 1, base_step + steps,
                      out.error().message);
  }
  const int ran = static_cast<int>(out->losses.size());
  AP_CHECK(ran == steps || (out->stopped && ran >= 1 && ran < steps),
           "a run of {} steps reported {} losses", steps, ran);
  im.stopped = out->stopped;
  if (im.multi() && im.options.group->rank() != 0) {
    // the driver (rank 0) reported the steps; the other ranks know the losses at the end
    StepMetrics m;
    m.step = base_step + ran;
    m.steps = target;
    m.first_step = im.first_step;
    m.loss = out->losses.empty() ? 0.0 : out->losses.back();
    m.tokens = im.tokens + out->tokens;
    m.seconds = std::chrono::duration<double>(Clock::now() - *im.train_start).count();
    m.stages = im.stage_totals;
    im.last = m;
  }
  im.step = base_step + ran;
  im.tokens += out->tokens;
  im.transfers.lent += out->transfers.lent;
  im.transfers.copied += out->transfers.copied;
  im.transfers.bytes_copied += out->transfers.bytes_copied;
  for (size_t r = 0; r < out->stages.size() && r < im.stage_totals.size(); ++r) {
    im.stage_totals[r].busy_seconds += out->stages[r].busy_seconds;
    im.stage_totals[r].idle_seconds += out->stages[r].idle_seconds;
  }
  im.last.stages = im.stage_totals;
  im.last.tokens = im.tokens;
  for (const ActionSpan& s : out->spans) {
    im.spans.push_back(TraceSpan{s.stage, s.action, offset + s.start, offset + s.end, false});
  }
  for (const ActionSpan& s : out->update_spans) {
    im.spans.push_back(TraceSpan{s.stage, s.action, offset + s.start, offset + s.end, true});
  }
  for (const ReduceSpan& s : out->reduce_spans) {
    TraceSpan t;
    t.stage = s.stage;
    t.action.kind = ActionKind::OPT_STEP;
    t.action.stage = s.stage;
    t.action.version = static_cast<int>(s.step);
    t.start = offset + s.start;
    t.end = offset + s.end;
    t.allreduce = true;
    im.spans.push_back(t);
  }
  if (!im.callback_status.ok()) return im.callback_status.error();
  return im.last;
}

Status Trainer::train() {
  const TrainOptions& t = impl_->config.train;
  if (t.max_restarts == 0 || impl_->multi()) return train_once();
  Supervisor supervisor({t.max_restarts, t.restart_backoff, 60.0});
  return supervisor.run([this] { return train_once(); },
                        [this](const RestartEvent& e) {
                          return restart_from_checkpoint(e.restart, e.error, e.waited);
                        },
                        &stop_, [this] { return static_cast<long>(impl_->step); });
}

Status Trainer::restart_from_checkpoint(int restart, const std::string& error, double waited) {
  Impl& old = *impl_;
  Config c = old.config;
  const std::string& dir = c.checkpoint.dir;
  // the newest checkpoint of the directory that loads whole; none yet: where this trainer began
  if (!checkpoints_in(dir).empty()) c.checkpoint.resume = dir;
  c.checkpoint.overwrite = false;
  TrainerOptions o = old.options;
  o.fault = {};
  o.before_update = {};
  // the failed pipeline goes first: its memory, its metrics file and the directory's lock
  old.exec.reset();
  old.data.reset();
  old.metrics.reset();
  old.checkpoint_lock = CheckpointDirLock{};
  auto fresh = Trainer::create(c, o, true);
  if (!fresh) return fresh.error();
  std::unique_ptr<Impl> im = std::move((*fresh)->impl_);
  // the config as given (the resume is this restart's), and what this trainer has counted
  im->config.checkpoint.resume = old.config.checkpoint.resume;
  im->config.checkpoint.overwrite = old.config.checkpoint.overwrite;
  im->callback = std::move(old.callback);
  im->migration_callback = std::move(old.migration_callback);
  im->restart_callback = std::move(old.restart_callback);
  im->eval_callback = std::move(old.eval_callback);
  im->last_eval = old.last_eval;
  im->first_step = old.first_step;
  im->last.first_step = old.first_step;
  im->train_start = old.train_start;
  im->stage_totals = std::move(old.stage_totals);
  im->last.stages = im->stage_totals;
  im->spans = std::move(old.spans);
  im->marks = std::move(old.marks);
  im->tokens = std::max<int64_t>(0, (im->step - im->first_step) * im->tokens_per_step());
  im->last.tokens = im->tokens;
  im->restarts = restart;
  TrainerRestart r;
  r.restart = restart;
  r.max_restarts = im->config.train.max_restarts;
  r.error = error;
  r.waited = waited;
  r.resumed_from = im->resumed_from;
  r.step = im->step;
  im->write_metrics(restart_json(r.step, r.restart, r.max_restarts, r.resumed_from, r.error));
  impl_ = std::move(im);
  if (impl_->restart_callback) impl_->restart_callback(r);
  return impl_->callback_status;
}

void Trainer::on_restart(std::function<void(const TrainerRestart&)> callback) {
  impl_->restart_callback = std::move(callback);
}

int Trainer::restarts() const {
  return impl_->restarts;
}

Status Trainer::train_once() {
  Impl& im = *impl_;
  const int64_t target = im.config.train.steps;
  const std::string& dir = im.config.checkpoint.dir;
  const int every = dir.empty() ? 0 : im.config.checkpoint.every;
  const int eval_every = im.config.eval.every;
  const bool reports = !im.multi() || im.options.group->rank() == 0;
  im.stopped = false;
  while (im.step < target) {
    // between runs, one process stops at once; in a job the run's outcome (rank 0's request)
    // decides, so that every rank ends after the same step
    if (!im.multi() && stop_.requested()) {
      im.stopped = true;
      break;
    }
    // runs end at multiples of checkpoint.every, counted from step 0, so a resumed run splits
    // its steps exactly as the uninterrupted one did (a stop ends the asynchronous modes' runs
    // there too, and the sync modes' steps do not depend on the split)
    // (and at multiples of eval.every: an evaluation needs the pipeline drained too)
    int64_t end = every > 0 ? std::min(target, (im.step / every + 1) * every) : target;
    if (eval_every > 0) end = std::min(end, (im.step / eval_every + 1) * eval_every);
    auto r = run(static_cast<int>(end - im.step));
    if (!r) return r.error();
    if (im.stopped && im.step < target) break;
    im.stopped = false;  // a request that came with the last step: the training is done
    // the checkpoint first: an evaluation that fails loses no step
    if (every > 0 && im.step % every == 0) {
      if (auto p = save(dir); !p) return p.error();
    }
    if (eval_every > 0 && (im.step % eval_every == 0 || im.step == target)) {
      if (auto e = evaluate(); !e) return e.error();
    }
  }
  if (im.stopped) {
    if (!dir.empty() && im.checkpoint_step != im.step) {
      if (auto p = save(dir); !p) return p.error();
    }
    const int sig = stop_.signal();
    im.write_metrics(stopped_json(im.step, sig <= 0 ? std::string() : signal_name(sig),
                                  dir.empty() ? std::string() : im.last_checkpoint));
  } else if (!dir.empty()) {
    if (auto p = save(dir, true); !p) return p.error();
  }
  if (!im.config.train.trace.empty() && reports) {
    if (Status ok = write_trace(im.config.train.trace); !ok) return ok;
  }
  if (!im.callback_status.ok()) return im.callback_status.error();
  return {};
}

void Trainer::request_stop(int signal) noexcept {
  stop_.request(signal);
}

bool Trainer::stopped() const {
  return impl_->stopped;
}

const TensorTransfers& Trainer::transfers() const {
  return impl_->transfers;
}

int Trainer::stop_signal() const {
  return stop_.signal();
}

const std::string& Trainer::last_checkpoint() const {
  return impl_->last_checkpoint;
}

Expected<std::string> Trainer::save(const std::string& dir, bool final) {
  Impl& im = *impl_;
  if (dir.empty()) return make_error("checkpoint: no directory given (checkpoint.dir is empty)");
  RunPosition pos;
  pos.step = im.step;
  pos.data_position = im.data->position();
  pos.final = final;
  auto workers = im.workers();
  auto optimizers = im.optimizers();
  if (!im.multi()) {
    auto path = save_pipeline_checkpoint(dir, im.config, pos, workers, optimizers);
    if (!path) return make_error("checkpoint.dir = \"{}\": {}", dir, path.error().message);
    im.last_checkpoint = *path;
    im.checkpoint_step = final ? -1 : im.step;
    return path;
  }
  // several processes: each writes its own stages' tensors into the one checkpoint (replica 0's
  // processes: the other replicas hold the same bits and take part without tensors)
  std::vector<StageRefs> mine;
  for (size_t i = 0; i < workers.size() && im.exec->replica() == 0; ++i) {
    StageWorker* w = workers[i];
    OptimizerShard* o = optimizers[i];
    auto refs = pipeline_checkpoint_refs(std::span<StageWorker* const>(&w, 1),
                                         std::span<OptimizerShard* const>(&o, 1));
    if (!refs) return make_error("checkpoint.dir = \"{}\": {}", dir, refs.error().message);
    mine.push_back({w->stage(), std::move(*refs)});
  }
  ProcessGroup& group = *im.options.group;
  auto gather = [&group](std::string text) -> Expected<std::vector<std::string>> {
    RankPart part;
    part.text = std::move(text);
    auto parts = group.all_gather(std::move(part));
    if (!parts) return parts.error();
    std::vector<std::string> out;
    for (RankPart& p : *parts) out.push_back(std::move(p.text));
    return out;
  };
  const CheckpointInfo info = pipeline_checkpoint_info(im.config, pos, workers[0]->updates());
  auto path = save_checkpoint_shared(dir, info, mine, group.rank(), gather);
  // a rank lost while the processes wrote together: say which checkpoint (rank 0 may have
  // committed it before the last agreement failed; otherwise it never left its temporary name)
  if (!path)
    return make_error(
        "checkpoint.dir = \"{}\": while writing the {} together: {}", dir,
        final ? std::string("final checkpoint") : fmt::format("checkpoint of step {}", pos.step),
        path.error().message);
  im.last_checkpoint = *path;
  im.checkpoint_step = final ? -1 : im.step;
  return path;
}

std::span<const TraceSpan> Trainer::trace() const {
  return impl_->spans;
}

Status Trainer::write_trace(const std::string& path) const {
  return write_chrome_trace(path, impl_->spans, impl_->exec->stages(), impl_->marks);
}

const Config& Trainer::config() const {
  return impl_->config;
}

Backend Trainer::backend() const {
  return impl_->options.backend;
}

int64_t Trainer::step_count() const {
  return impl_->step;
}

const StepMetrics& Trainer::last_metrics() const {
  return impl_->last;
}

int Trainer::stages() const {
  return impl_->exec->stages();
}

std::vector<int> Trainer::partition() const {
  return impl_->partition().counts();
}

int Trainer::num_layers() const {
  return impl_->model().num_layers();
}

int64_t Trainer::parameter_count() const {
  return static_cast<int64_t>(impl_->model().unique_parameters());
}

std::string Trainer::devices() const {
  std::string stages;
  bool off_host = false;
  for (int r = 0; r < impl_->exec->stages(); ++r) {
    if (!impl_->exec->local(r)) continue;
    const BackendMemory& memory = impl_->exec->worker(r).memory();
    off_host = off_host || !memory.host_memory();
    stages += fmt::format("{}stage {}: {}", stages.empty() ? "" : "; ", r, memory.name());
  }
  return off_host ? stages : "CPU";
}

std::span<const float> Trainer::params(int layer) const {
  AP_CHECK(layer >= 0 && layer < num_layers(), "layer {} of {}", layer, num_layers());
  const Partition& p = impl_->partition();
  const int r = p.stage_of(layer);
  const StageWorker& w = impl_->exec->worker(r);
  AP_CHECK(w.memory().host_memory(),
           "Trainer::params({}): stage {} holds the layer in {}, not in host memory "
           "(pipeline.device = \"{}\"); Trainer::weights() copies it out",
           layer, r, w.memory().name(), impl_->config.pipeline.device);
  return w.params(layer - p.begin(r));
}

bool Trainer::holds_layer(int layer) const {
  return layer >= 0 && layer < num_layers() &&
         impl_->exec->local(impl_->partition().stage_of(layer));
}

std::vector<NamedTensor> Trainer::weights() const {
  std::vector<NamedTensor> out;
  const Model& model = impl_->model();
  for (int i = 0; i < model.num_layers(); ++i) {
    if (!holds_layer(i)) continue;
    const Partition& part = impl_->partition();
    const int r = part.stage_of(i);
    const StageWorker& w = impl_->exec->worker(r);
    std::vector<float> staging;
    const std::span<const float> p = host_view(w.memory(), w.params(i - part.begin(r)), staging);
    for (const ParamSlot& slot : model.layer(i).slots()) {
      NamedTensor t;
      t.name = model.param_name(i, slot);
      t.dtype = "F32";
      t.shape = slot.shape;
      t.f32.assign(p.begin() + static_cast<std::ptrdiff_t>(slot.offset),
                   p.begin() + static_cast<std::ptrdiff_t>(slot.offset + slot.numel));
      out.push_back(std::move(t));
    }
  }
  return out;
}

std::string Trainer::data_description() const {
  return impl_->data->describe();
}

std::optional<double> Trainer::loss_floor() const {
  return impl_->data->expected_loss_floor(sequence_length(impl_->config));
}

const std::string& Trainer::resumed_from() const {
  return impl_->resumed_from;
}

const std::vector<std::string>& Trainer::skipped_checkpoints() const {
  return impl_->skipped_checkpoints;
}

}  // namespace actorpipe
