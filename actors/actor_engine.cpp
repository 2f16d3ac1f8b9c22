// Actor engine: builds the stage workers, lays out the run's schedules, spawns the driver, the
// stage actors and the optimizer shards on a CAF system, and returns what the run produced.
#include "actors/actor_engine.hpp"

#include <algorithm>
#include <atomic>
#include <caf/all.hpp>
#include <charconv>
#include <cmath>
#include <optional>
#include <random>

#include "actors/driver.hpp"
#include "actors/gpu_links.hpp"
#include "actors/internal/actor_exits.hpp"
#include "actors/internal/messages.hpp"
#include "actors/internal/microbatch_feed.hpp"
#include "actors/internal/remote_mail.hpp"
#include "actors/internal/run_state.hpp"
#include "actors/migration_manager.hpp"
#include "actors/optimizer_actor.hpp"
#include "actors/process_group.hpp"
#include "actors/process_move.hpp"
#include "actors/replica_reducer.hpp"
#include "actors/stage_actor.hpp"
#include "engine/config/config.hpp"
#include "engine/config/forced_moves.hpp"
#include "engine/data/loader.hpp"
#include "engine/devices/stage_devices.hpp"
#include "engine/execution/compute_precision.hpp"
#include "engine/execution/memory_check.hpp"
#include "engine/execution/optimizer_shard.hpp"
#include "engine/execution/replicated_executor.hpp"
#include "engine/execution/stage_worker.hpp"
#include "engine/execution/tied_params.hpp"
#include "engine/migration/layer_move.hpp"
#include "engine/migration/migration_policy.hpp"
#include "engine/model/model.hpp"
#include "engine/model/partition.hpp"
#include "engine/model/placement.hpp"
#include "engine/profiler/auto_partition.hpp"
#include "engine/schedule/generators.hpp"
#include "engine/schedule/lowering.hpp"
#include "engine/schedule/simulator.hpp"
#include "engine/schedule/validate.hpp"
#include "kernels/check.hpp"
#include "kernels/compute_backend.hpp"
#include "transport/local_channel.hpp"
#include "transport/ucx_channel.hpp"

namespace actorpipe {

struct ActorEngine::Impl {
  Config config;
  ActorEngineOptions options;
  Mode mode = Mode::onef1b;
  int B = 1, T = 1;
  std::unique_ptr<Model> model;
  std::unique_ptr<Partition> partition;
  StageDevices devices;  // pipeline.device's backends (destroyed after the workers)
  std::vector<std::unique_ptr<StageWorker>> workers;
  std::vector<std::unique_ptr<OptimizerShard>> shards;  // null for stages of other ranks
  ProcessGroup* group = nullptr;                        // null or world 1: one process
  GpuLinks gpu_links;  // cluster.gpu_channel = "nccl": the NCCL links, kept between runs
  Placement placement;
  int rank = 0;
  int64_t mb_done = 0;  // microbatches consumed by earlier runs (this replica's)
  // pipeline.replicas: this pipeline is replica `replica` of `replicas`
  int replicas = 1;
  int replica = 0;
  std::unique_ptr<ReplicaReducer> reducer;  // replicas > 1
  bool multi() const { return group != nullptr && placement.world() > 1; }

  // migration: the manager's own actor system, alive as long as the engine; in a job of
  // several processes only the driver's process runs the manager, and the others follow its
  // verdicts (they hold the setup's forced moves and check interval, no manager)
  std::shared_ptr<MigrationManagerSetup> migration;
  std::unique_ptr<caf::actor_system_config> migration_config;  // the system refers to it
  std::unique_ptr<caf::actor_system> migration_system;
  caf::actor manager;
  bool first_run = true;
  uint32_t moves = 0;       // moves across processes so far (every rank counts alike)
  bool announcing = false;  // the lead rank asks its manager at a boundary: a move announces
  bool announced = false;   // ... and did
  bool lead() const { return rank == placement.first_rank(); }

  // eval_microbatches > 0: a held-out evaluation of that many microbatches (steps ignored)
  // cut_request: set during the run, it ends the run after the step in flight (a migration)
  Expected<ActorRunResult> run_segment(int steps, DataLoader& data, const ActorCallbacks& callbacks,
                                       int eval_microbatches = 0,
                                       std::shared_ptr<std::atomic<bool>> cut_request = nullptr);
  Expected<MoveReport> move_to(const std::vector<int>& counts);
  Expected<std::optional<MigrationEvent>> ask_manager(long step);
  // a check of the automatic rule during a run (the driver's rank): a verdict to report, or a
  // decision to move at the segment's end
  Expected<MigrationCheck> check(long step);
  Expected<std::optional<MigrationEvent>> boundary(long step);
  // a job of several processes: the lead rank tells the others what its manager decided at a
  // boundary (counts, or none), before any move
  Status announce(const std::optional<std::vector<int>>& counts);
  Expected<std::optional<std::vector<int>>> await_verdict();
  long updates() const;
};

namespace {

// Rank `rank`'s job_config_lines (as text) against rank 0's: the first key that differs.
Status same_job_config(const std::string& first, const std::string& other, int rank) {
  if (first == other) return {};
  auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    size_t at = 0;
    for (size_t nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
      out.push_back(text.substr(at, nl - at));
    return out;
  };
  const auto a = lines(first), b = lines(other);
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i] == b[i]) continue;
    return make_error(
        "rank {} joined with another config than rank 0: {} (rank 0 has {}); every process of "
        "a job must be started with the same config",
        rank, b[i], a[i]);
  }
  return make_error("rank {} joined with another config than rank 0 ({} keys against {})", rank,
                    b.size(), a.size());
}

// ActorEngineOptions::slow_stage and slowdown: off (-1, 1.0) or a stage and a factor >= 1.
Status check_slowdown(int stage, double factor, int stages) {
  if (stage < -1 || stage >= stages || !(factor >= 1.0) || !std::isfinite(factor)) {
    return make_error(
        "actor engine: slowdown of stage {} by {}: expected a stage in [-1, {}) and "
        "a finite factor >= 1",
        stage, factor, stages);
  }
  return {};
}

}  // namespace

ActorEngine::ActorEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ActorEngine::~ActorEngine() {
  if (impl_ && impl_->manager) {
    caf::anon_send_exit(impl_->manager, caf::exit_reason::user_shutdown);
    impl_->manager = nullptr;
    impl_->migration_system.reset();  // waits for the manager to stop
  }
}

Expected<std::unique_ptr<ActorEngine>> ActorEngine::create(const Config& given,
                                                           const ActorEngineOptions& options,
                                                           ProcessGroup* group) {
  if (Status ok = validate(given); !ok) return ok.error();
  Config config = given;
  if (options.model) {
    auto declared = options_for_model(given.model, *options.model);
    if (!declared) return declared.error();
    config.model = *declared;
  }
  if (options.scheduler_threads < 1)
    return make_error("actor engine: scheduler_threads = {}, expected >= 1",
                      options.scheduler_threads);
  if (options.spin_before_wait_us < 0)
    return make_error("actor engine: spin_before_wait_us = {}, expected >= 0",
                      options.spin_before_wait_us);
  if (Status ok = check_slowdown(options.slow_stage, options.slowdown, config.pipeline.stages); !ok)
    return ok.error();
  if (options.poll_before_wait_us < 0)
    return make_error("actor engine: poll_before_wait_us = {}, expected >= 0",
                      options.poll_before_wait_us);
  if (!(options.stall_timeout_seconds > 0))
    return make_error("actor engine: stall_timeout_seconds = {}, expected > 0",
                      options.stall_timeout_seconds);
  const FaultInjection& f = options.fault;
  if (f.kind != FaultInjection::Kind::none &&
      (f.stage < 0 || f.stage >= config.pipeline.stages || f.microbatch < 0)) {
    return make_error(
        "actor engine: fault injection at stage {}, microbatch {}: expected a stage in [0, {}) "
        "and a microbatch >= 0",
        f.stage, f.microbatch, config.pipeline.stages);
  }
  if (plans_automatically(config.pipeline) && group != nullptr && group->world() > 1) {
    return make_error(
        "pipeline.partition or pipeline.recompute = \"auto\" in a job of {} processes: the "
        "engine would plan in each process, and two could plan differently; plan once for the "
        "job first (plan_job, actors/job_plan.hpp: Trainer::create does)",
        group->world());
  }
  // "auto": the planner's partition from the measured (or cached) profile
  AutoPartitionOptions planning;
  planning.model = options.model.get();
  auto resolved = resolve_partition(config, planning);
  if (!resolved) return resolved.error();
  auto impl = std::make_unique<Impl>();
  impl->config = *resolved;
  impl->options = options;
  auto mode = parse_mode(config.pipeline.mode);
  if (!mode) return mode.error();
  impl->mode = *mode;
  if (options.model) {
    impl->model = std::make_unique<Model>(*options.model);
  } else {
    auto model = Model::build(config.model);
    if (!model) return model.error();
    impl->model = std::make_unique<Model>(std::move(*model));
  }
  auto part = Partition::from_options(impl->config.pipeline, impl->model->num_layers());
  if (!part) return part.error();
  if (Status ok = check_tied_placement(*impl->model, *part, impl->mode); !ok) return ok.error();
  impl->partition = std::make_unique<Partition>(std::move(*part));
  auto recompute = recompute_flags(impl->config.pipeline.recompute, impl->model->num_layers());
  if (!recompute) return recompute.error();
  if (!options.backends.empty() &&
      static_cast<int>(options.backends.size()) != impl->partition->stages()) {
    return make_error("backends: {} entries for {} stages", options.backends.size(),
                      impl->partition->stages());
  }
  impl->B = config.pipeline.microbatch_size;
  impl->T = config.pipeline.seq_len > 0 ? config.pipeline.seq_len : config.model.context;
  impl->group = group;
  const int world = group != nullptr ? group->world() : 1;
  impl->rank = group != nullptr ? group->rank() : 0;
  impl->placement = Placement(impl->partition->stages());  // one process: cluster.* ignored
  impl->replicas = config.pipeline.replicas;
  if (impl->replicas == 0) {
    return make_error(
        "pipeline.replicas = 0: the planner's choice must be made first (Trainer::create does: "
        "plan_job)");
  }
  if (impl->replicas > 1 && world == 1) {
    return make_error(
        "pipeline.replicas = {}: the actors backend runs each replica in processes of its own "
        "(a job of a multiple of {} processes: actorpipe-launch -n ...); in one process the "
        "serial backend runs replicas (--backend serial)",
        impl->replicas, impl->replicas);
  }
  std::vector<Placement> replica_placements;
  if (world > 1) {
    // every process must train the same thing: the keys a job shares, compared with rank 0's
    RankPart shared;
    for (const std::string& line : job_config_lines(config)) shared.text += line + "\n";
    auto configs = group->all_gather(std::move(shared));
    if (!configs)
      return make_error("rank {}: comparing configs: {}", impl->rank, configs.error().message);
    for (const RankPart& p : *configs) {
      if (Status same = same_job_config((*configs)[0].text, p.text, p.rank); !same)
        return make_error("rank {}: {}", impl->rank, same.error().message);
    }
    if (world % impl->replicas != 0) {
      return make_error(
          "pipeline.replicas = {}: a job of {} processes cannot be split into {} equal "
          "replicas (allowed: a multiple of {} processes)",
          impl->replicas, world, impl->replicas, impl->replicas);
    }
    impl->replica = impl->rank / (world / impl->replicas);
    for (int q = 0; q < impl->replicas; ++q) {
      auto placement = Placement::make(config.cluster.placement, impl->partition->stages(), world,
                                       impl->replicas, q);
      if (!placement) return placement.error();
      replica_placements.push_back(*placement);
    }
    impl->placement = replica_placements[static_cast<size_t>(impl->replica)];
  }
  // pipeline.device: this process's stages' backends, unless the caller gave them
  std::vector<ComputeBackend*> backends = options.backends;
  if (config.pipeline.device != "cpu") {
    if (!backends.empty()) {
      return make_error(
          "pipeline.device = \"{}\" and ActorEngineOptions::backends: give the stages' "
          "backends one way",
          config.pipeline.device);
    }
    const Placement& placement = impl->placement;
    const int rank = impl->rank;
    auto devices = StageDevices::open(config.pipeline, impl->partition->stages(),
                                      [&](int r) { return placement.rank_of(r) == rank; });
    if (!devices) {
      return world > 1 ? make_error("rank {}: {}", rank, devices.error().message) : devices.error();
    }
    impl->devices = std::move(*devices);
    backends = impl->devices.backends();
  }
  // a model whose stages here cannot fit is an error naming its size, not std::bad_alloc (the
  // host's RAM holds the stages on the CPU, a GPU's memory the stages on it)
  if (Status ok = check_stages_fit(
          *impl->model, *impl->partition, impl->mode, config.optimizer.kind,
          impl->placement.stages_of(impl->rank),
          std::vector<BackendMemory*>(backends.begin(), backends.end()), impl->B, impl->T,
          parse_precision(config.pipeline.precision).value_or(Precision::fp32),
          config.pipeline.stash_precision == "bf16");
      !ok)
    return world > 1 ? make_error("rank {}: {}", impl->rank, ok.error().message) : ok.error();
  // bf16 with the CPU kernels needs the CPU's bf16 instructions; a GPU's products do not
  auto precision = resolve_precision(config.pipeline.precision, impl->devices.cpu_kernels());
  if (!precision) return precision.error();
  for (int r = 0; r < impl->partition->stages(); ++r) {
    if (impl->placement.rank_of(r) != impl->rank) {
      impl->workers.push_back(nullptr);
      impl->shards.push_back(nullptr);
      continue;
    }
    StageWorkerOptions wo;
    wo.mode = impl->mode;
    wo.stage = r;
    wo.microbatches = config.pipeline.microbatches / impl->replicas;
    wo.replicas = impl->replicas;
    wo.B = impl->B;
    wo.T = impl->T;
    wo.threads = config.pipeline.threads_per_stage;
    wo.precision = *precision;
    wo.bf16_stash = config.pipeline.stash_precision == "bf16";
    wo.log_versions = options.log_versions;
    wo.recompute = *recompute;
    wo.backend = backends.empty() ? nullptr : backends[static_cast<size_t>(r)];
    if (Status ok = check_stage_backend(wo); !ok) return ok.error();
    impl->workers.push_back(
        std::make_unique<StageWorker>(*impl->model, *impl->partition, config.optimizer, wo));
    impl->shards.push_back(std::make_unique<OptimizerShard>(
        *impl->model, *impl->partition, r, config.optimizer, impl->workers.back()->memory()));
    impl->workers.back()->predict_from(*impl->shards.back());
  }
  // the migration manager, when a move is forced or the automatic one is on
  auto forced = parse_forced_moves(config.migration.moves);
  if (!forced) return forced.error();
  if (!forced->empty() || config.migration.enabled) {
    if (impl->replicas > 1) {
      return make_error(
          "migration.moves / migration.enabled with pipeline.replicas = {}: layers move within "
          "one pipeline; a move in one replica only would change what the replicas sum",
          impl->replicas);
    }
    auto setup = std::make_shared<MigrationManagerSetup>();
    setup->forced = std::move(*forced);
    setup->check_every = config.migration.check_every;
    Impl* im = impl.get();
    setup->move = [im](const std::vector<int>& counts) { return im->move_to(counts); };
    impl->migration = setup;
    // in a job of several processes the lead rank's manager decides for all: the others hold
    // the setup (the boundaries, the move) and follow its verdicts
    if (impl->lead()) {
      if (config.migration.enabled) {
        // the profile (measured once, or cached) and the planner's options for this pipeline
        auto profiled = plan_auto_partition(impl->config, planning);
        if (!profiled) return make_error("migration.enabled: {}", profiled.error().message);
        setup->policy =
            std::make_unique<MigrationPolicy>(config.migration, profiled->costs, profiled->planner,
                                              layer_move_bytes(profiled->costs, impl->mode));
      }
      impl->migration_config = std::make_unique<caf::actor_system_config>();
      caf::actor_system_config& cfg = *impl->migration_config;
      internal::add_message_types(cfg);
      cfg.set("scheduler.max-threads", 1);
      cfg.set("work-stealing.moderate-poll-attempts", size_t{0});
      impl->migration_system = std::make_unique<caf::actor_system>(cfg);
      impl->manager = spawn_migration_manager(*impl->migration_system, std::move(setup));
    }
  }
  if (impl->replicas > 1) {
    // one Gloo group per stage across the replicas; an all-reduce may wait for a replica that
    // runs behind as long as a stalled run may
    const auto timeout = std::chrono::milliseconds(
        static_cast<int64_t>(std::max(1.0, options.stall_timeout_seconds) * 1000.0));
    auto reducer = ReplicaReducer::connect(*group, replica_placements, timeout);
    if (!reducer) return make_error("rank {}: {}", impl->rank, reducer.error().message);
    impl->reducer = std::move(*reducer);
  }
  return std::unique_ptr<ActorEngine>(new ActorEngine(std::move(impl)));
}

const Config& ActorEngine::config() const {
  return impl_->config;
}

int ActorEngine::stages() const {
  return static_cast<int>(impl_->workers.size());
}

const Placement& ActorEngine::placement() const {
  return impl_->placement;
}

int ActorEngine::rank() const {
  return impl_->rank;
}

int ActorEngine::replicas() const {
  return impl_->replicas;
}

int ActorEngine::replica() const {
  return impl_->replica;
}

bool ActorEngine::local(int stage) const {
  return stage >= 0 && stage < stages() && impl_->workers[static_cast<size_t>(stage)] != nullptr;
}

StageWorker& ActorEngine::worker(int stage) {
  AP_CHECK(local(stage), "stage {} of {} runs on rank {}, not here (rank {})", stage, stages(),
           impl_->placement.rank_of(stage), impl_->rank);
  return *impl_->workers[static_cast<size_t>(stage)];
}

const StageWorker& ActorEngine::worker(int stage) const {
  AP_CHECK(local(stage), "stage {} of {} runs on rank {}, not here (rank {})", stage, stages(),
           impl_->placement.rank_of(stage), impl_->rank);
  return *impl_->workers[static_cast<size_t>(stage)];
}

OptimizerShard& ActorEngine::optimizer(int stage) {
  AP_CHECK(local(stage), "stage {} of {} runs on rank {}, not here (rank {})", stage, stages(),
           impl_->placement.rank_of(stage), impl_->rank);
  return *impl_->shards[static_cast<size_t>(stage)];
}

const OptimizerShard& ActorEngine::optimizer(int stage) const {
  AP_CHECK(local(stage), "stage {} of {} runs on rank {}, not here (rank {})", stage, stages(),
           impl_->placement.rank_of(stage), impl_->rank);
  return *impl_->shards[static_cast<size_t>(stage)];
}

Status ActorEngine::set_slowdown(int stage, double factor) {
  if (Status ok = check_slowdown(stage, factor, stages()); !ok) return ok;
  impl_->options.slow_stage = stage;
  impl_->options.slowdown = factor;
  return {};
}

std::span<const float> ActorEngine::params(int layer) const {
  AP_CHECK(layer >= 0 && layer < impl_->model->num_layers(), "layer {} of {}", layer,
           impl_->model->num_layers());
  const int r = impl_->partition->stage_of(layer);
  AP_CHECK(worker(r).memory().host_memory(),
           "layer {}: stage {} holds it in {}, not in host memory (copy it out: "
           "host_view(worker(stage).memory(), ...))",
           layer, r, worker(r).memory().name());
  return worker(r).params(layer - impl_->partition->begin(r));
}

namespace {

using internal::Directory;
using internal::RunOutcome;
using internal::RunState;

// Asks the driver to run and returns its outcome; every stage and shard is stopped after it.
RunOutcome drive(caf::actor_system& sys, const RunState& st) {
  RunOutcome outcome;
  caf::scoped_actor self{sys};
  self->request(st.directory.driver, caf::infinite, internal::run_atom::value)
      .receive([&](RunOutcome& o) { outcome = std::move(o); },
               [&](caf::error& err) {
                 outcome.ok = false;
                 outcome.error = "driver: " + sys.render(err);
               });
  for (const caf::actor& a : st.directory.stages)
    self->send_exit(a, caf::exit_reason::user_shutdown);
  for (const caf::actor& a : st.directory.optimizers)
    self->send_exit(a, caf::exit_reason::user_shutdown);
  return outcome;
}

// One process: a fresh actor system for the run, every actor in it.
Expected<RunOutcome> run_here(const std::shared_ptr<RunState>& st) {
  RunOutcome outcome;
  {
    caf::actor_system_config cfg;
    internal::add_message_types(cfg);
    cfg.set("scheduler.max-threads", st->options.scheduler_threads);
    // an idle scheduler thread (the driver's) parks on its condition variable right after its
    // aggressive polling instead of CAF's default 500 polls 50 us apart: each such sleep
    // overshoots by the timer slack, which a message to the driver would otherwise wait out
    cfg.set("work-stealing.moderate-poll-attempts", size_t{0});
    caf::actor_system sys{cfg};
    st->start = std::chrono::steady_clock::now();
    for (int r = 0; r < st->stages; ++r) {
      st->directory.stages.push_back(spawn_stage_actor(sys, st, r));
      st->directory.optimizers.push_back(spawn_optimizer_actor(sys, st, r));
    }
    st->directory.driver = spawn_driver(sys, st);
    outcome = drive(sys, *st);
    // every actor stops after its current action; only then may the handles they read go
    sys.await_all_actors_done();
    st->directory = Directory{};
  }
  return outcome;
}

// The outcome as text, to hand it from rank 0 to the others.
std::string encode(caf::actor_system& sys, RunOutcome o) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  if (auto err = sink(o)) return {};
  return {buf.begin(), buf.end()};
}

Expected<RunOutcome> decode(caf::actor_system& sys, const std::string& text) {
  RunOutcome o;
  std::vector<char> buf(text.begin(), text.end());
  caf::binary_deserializer source{sys, buf};
  if (auto err = source(o)) return make_error("rank 0's outcome unreadable: {}", sys.render(err));
  return o;
}

// The stream of a run's remote mail, chosen by the run's lead: counted from a random start in
// each process, so neither a later run nor a relaunched lead reuses the stream of a run whose
// leftovers a peer's worker may still hold (a failed run's messages nobody received).
uint32_t next_mail_stream() {
  static std::atomic<uint32_t> next{std::random_device{}()};
  return next.fetch_add(1) & 0xFFFF;
}

// Several processes: this rank's stages and shards (and on rank 0 the driver) in the group's
// actor system; the ranks agree on the directory of every actor before the driver starts, and
// on rank 0's outcome after every actor has stopped.
Expected<RunOutcome> run_ranks(ProcessGroup& group, const std::shared_ptr<RunState>& st) {
  caf::actor_system& sys = group.system();
  const int rank = group.rank();
  const int lead = st->driver_rank;  // this replica's first rank (0 without replicas)
  const int per_replica = group.world() / st->replicas;
  std::vector<int> mine;
  for (int r = 0; r < st->stages; ++r)
    if (st->workers[static_cast<size_t>(r)] != nullptr) mine.push_back(r);
  st->start = std::chrono::steady_clock::now();
  st->directory.stages.assign(static_cast<size_t>(st->stages), caf::actor{});
  st->directory.optimizers.assign(static_cast<size_t>(st->stages), caf::actor{});
  std::vector<caf::actor> local;
  // each local actor's end, counted once every message about it has been sent (the middleman's
  // among them, which a down message to a monitor of ours would come before)
  internal::ActorExits exits;
  for (int r : mine) {
    const caf::actor stage = spawn_stage_actor(sys, st, r);
    const caf::actor shard = spawn_optimizer_actor(sys, st, r);
    exits.watch(stage);
    exits.watch(shard);
    local.push_back(stage);
    local.push_back(shard);
    // a channel from another process hands its announcements to the stage directly
    auto deliver = [stage](const Announcement& a) {
      caf::anon_send(stage, internal::ann_atom::value, a);
    };
    if (r > 0) st->channels->forward(r - 1).on_announcement(deliver);
    if (r + 1 < st->stages) st->channels->backward(r).on_announcement(deliver);
    // and so does a tied channel: gradient contributions to the stage's shard, weight values
    // to the stage (as the sender would have sent them)
    for (uint32_t tag = 0; tag < st->channels->size(); ++tag) {
      if (!st->channels->has(tag)) continue;
      TensorChannel& ch = st->channels->at(tag);
      const ChannelEnds ends = ch.ends();
      if (ends.tied < 0 || ends.to != r) continue;
      const bool gradient =
          ends.kind == ChannelKind::tied_to_owner || ends.kind == ChannelKind::tied_to_copy;
      ch.on_announcement([ends, gradient, to = gradient ? shard : stage](const Announcement& a) {
        const internal::TiedAnnouncement t = internal::tied_announcement(ends, a);
        if (gradient)
          caf::anon_send(to, internal::tgrad_atom::value, t);
        else
          caf::anon_send(to, internal::tweight_atom::value, t);
      });
    }
  }
  if (rank == lead) {
    local.push_back(spawn_driver(sys, st));
    exits.watch(local.back());
  }

  // a lost rank: the driver fails the run, asking every stage where it stands; elsewhere this
  // rank's actors stop (the driver may be gone with its rank)
  if (rank == lead) {
    const caf::actor driver = local.back();
    group.on_lost([driver, st](int lost, const std::string& reason) {
      // a stage waiting for the lost rank's payload ends its wait now, not at peer_timeout
      st->channels->interrupt(fmt::format("rank {} was lost: {}", lost, reason));
      caf::anon_send(driver, internal::lost_atom::value, static_cast<int32_t>(lost), reason);
    });
  } else {
    group.on_lost([local, st](int lost, const std::string& reason) {
      st->channels->interrupt(fmt::format("rank {} was lost: {}", lost, reason));
      for (const caf::actor& a : local) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    });
  }
  auto stop_local = [&] {
    for (const caf::actor& a : local) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  };
  // waits until every local actor has ended
  auto await_local = [&] { exits.wait(); };
  std::unique_ptr<internal::RemoteMail> mail;
  auto fail = [&](const Error& e) -> Expected<RunOutcome> {
    stop_local();
    await_local();
    st->mail = nullptr;
    mail.reset();
    group.on_lost({});
    st->directory = Directory{};
    return e;
  };

  RankPart part;
  part.actors = local;
  if (rank == lead) part.text = std::to_string(next_mail_stream());
  auto parts = group.all_gather(std::move(part));
  if (!parts) return fail(parts.error());
  uint32_t stream = 0;
  for (const RankPart& p : *parts) {
    size_t i = 0;
    for (int r = 0; r < st->stages; ++r) {
      if (st->rank_of_stage[static_cast<size_t>(r)] != p.rank) continue;
      if (i + 2 > p.actors.size())
        return fail(make_error("rank {} sent {} actors", p.rank, p.actors.size()));
      st->directory.stages[static_cast<size_t>(r)] = p.actors[i++];
      st->directory.optimizers[static_cast<size_t>(r)] = p.actors[i++];
    }
    if (p.rank % per_replica == 0) {  // a replica's first rank: its driver comes last
      if (p.actors.empty() || (p.rank == lead && i + 1 != p.actors.size()))
        return fail(make_error("rank {} sent no driver", p.rank));
      if (p.rank == lead) st->directory.driver = p.actors.back();
      if (st->replicas > 1) st->directory.drivers.push_back(p.actors.back());
    }
    if (p.rank == lead) stream = static_cast<uint32_t>(std::strtoul(p.text.c_str(), nullptr, 10));
  }
  // control messages to and from the other processes on UCX, on the lead's stream for this run
  if (st->options.remote_mail && group.ucx() != nullptr) {
    auto m = internal::RemoteMail::create(sys, *st, group.ucx(), rank, group.peers(), stream);
    if (!m) return fail(m.error());
    mail = std::move(*m);
    st->mail = mail.get();
  }
  // every rank holds the directory before the driver's first message
  if (auto barrier = group.all_gather({}); !barrier) return fail(barrier.error());
  if (auto l = group.lost()) return fail(make_error("rank {}: {}", rank, *l));

  RankPart result;
  RunOutcome outcome;
  if (rank == lead) {
    outcome = drive(sys, *st);
    result.text = encode(sys, outcome);
  }
  await_local();
  st->mail = nullptr;
  mail.reset();
  group.on_lost({});
  st->directory = Directory{};
  auto all = group.all_gather(std::move(result));
  // rank 0's outcome (replica 0's: with replicas, its losses are the job's)
  if (all) return decode(sys, (*all)[0].text);
  // a rank is gone: the driver knows why the run failed; the others say where their stages
  // stood
  if (rank == lead && !outcome.ok) return outcome;
  std::string where;
  for (int r : mine) {
    const size_t pc = static_cast<size_t>(
        st->counters[static_cast<size_t>(r)].pc.load(std::memory_order_relaxed));
    if (pc >= st->actions(r)) {
      where += fmt::format("; stage {} had finished", r);
    } else {
      const internal::StageStep step = st->step(r, pc);
      where += fmt::format("; stage {} was at {} (action {} of {}, microbatch {})", r,
                           to_string(step.action), pc, st->actions(r), st->global_mb(step.mb));
    }
  }
  const auto lost = group.lost();
  return make_error("rank {}: {}{}", rank, lost ? *lost : all.error().message, where);
}

}  // namespace

Expected<ActorRunResult> ActorEngine::Impl::run_segment(
    int steps, DataLoader& data, const ActorCallbacks& callbacks, int eval_microbatches,
    std::shared_ptr<std::atomic<bool>> cut_request) {
  using namespace internal;
  const Impl& im = *this;
  const int d = static_cast<int>(workers.size());
  const bool eval = eval_microbatches > 0;
  // with replicas, each runs its share of every step (ReplicaSplit); an evaluation is whole
  const int m = im.config.pipeline.microbatches / im.replicas;

  auto st = std::make_shared<RunState>();
  st->options = im.options;
  st->mode = im.mode;
  st->stages = d;
  st->rank_of_stage = im.placement.ranks();
  st->driver_rank = im.placement.first_rank();
  st->rank = im.multi() ? im.rank : 0;
  st->replicas = im.replicas;
  st->replica = im.replica;
  st->reducer = eval ? nullptr : im.reducer.get();
  st->split_backward = im.config.pipeline.split_backward;
  st->skip_nonfinite = im.config.train.nonfinite == "skip" && !eval;
  st->eval = eval;
  st->B = im.B;
  st->T = im.T;
  // the job's tokens: a replica's microbatch stands for one of each replica's
  st->tokens_per_mb = static_cast<int64_t>(im.B) * im.T * (eval ? 1 : im.replicas);
  st->grad_clip = im.config.optimizer.grad_clip;
  st->global_offset = eval ? 0 : im.mb_done;
  st->callbacks = callbacks;

  if (eval) {
    // forward only: each microbatch is its own "step" of one (its loss is its mean)
    auto fwd = make_forward_only(d, eval_microbatches);
    if (!fwd) return fwd.error();
    st->schedule = std::move(*fwd);
    st->repeats = 1;
    st->credits = std::min(eval_microbatches, 2 * d);
    st->group = 1;
    st->total_mbs = eval_microbatches;
  } else {
    // the schedule of the run: one step, repeated per step, in sync modes; every step otherwise
    // (pipedream: every microbatch is a step)
    const bool sync = is_synchronous(im.mode);
    // 2bw continues the previous run when every stage holds its previous version (after a run, or
    // a resume that restored it), as the serial executor does
    bool continued = im.mode == Mode::twobw && !im.options.skip_compute &&
                     std::all_of(im.workers.begin(), im.workers.end(),
                                 [](const auto& w) { return !w || w->holds_previous(); });
    if (im.multi()) {  // every rank's stages
      RankPart mine;
      mine.text = continued ? "1" : "0";
      auto parts = im.group->all_gather(std::move(mine));
      if (!parts) return parts.error();
      continued = std::all_of(parts->begin(), parts->end(),
                              [](const RankPart& p) { return p.text == "1"; });
    }
    auto sched = im.mode == Mode::pipedream ? make_pipedream(d, steps)
                 : continued                ? make_2bw(d, m, steps, true)
                                            : make_schedule(im.mode, d, m, sync ? 1 : steps);
    if (!sched) return sched.error();
    auto lowered = lower(*sched);
    if (!lowered) return lowered.error();
    if (Status ok = validate(*lowered); !ok) return ok.error();
    st->schedule = std::move(*lowered);
    st->repeats = sync ? steps : 1;
    st->credits = std::max(1, peak_stash(st->schedule)[0]);
    st->group = st->schedule.microbatches;
    st->total_mbs = static_cast<int64_t>(st->repeats) * st->schedule.total_microbatches();
  }
  for (auto& w : workers) st->workers.push_back(w.get());
  for (auto& o : shards) st->shards.push_back(o.get());
  std::vector<TiedPair> tied;
  for (const TiedParam& tp : im.model->tied())
    tied.push_back({im.partition->stage_of(tp.owner_layer), im.partition->stage_of(tp.copy_layer)});
  Expected<ChannelSet> channels = make_error("no channels");
  if (im.multi()) {
    UcxChannelPlan plan;
    plan.rank_of_stage = im.placement.ranks();
    plan.tied = tied;
    plan.rank = im.rank;
    plan.worker = im.group->ucx();
    plan.peers = im.group->peers();
    plan.options.receive_timeout = im.group->options().peer_timeout;
    // announcements between stages travel with their payloads, not as run messages
    plan.options.carry_announcements = im.options.announce_on_channels;
    // tensors between processes of this host are lent in shared memory, not copied
    plan.options.shared_memory = im.config.cluster.shared_memory;
    if (im.config.pipeline.device == "cuda" && im.config.cluster.gpu_channel == "nccl") {
      // activations and gradients between GPU stages of two processes: NCCL, GPU to GPU
      std::vector<BackendMemory*> memory(static_cast<size_t>(d), nullptr);
      for (int r : im.placement.stages_of(im.rank))
        memory[static_cast<size_t>(r)] =
            &workers[static_cast<size_t>(r)]->memory().lasting_memory();
      if (Status ok = gpu_links.prepare(*im.group, plan.rank_of_stage, tied, memory,
                                        im.group->options().connect_timeout);
          !ok)
        return ok.error();
      NcclChannelOptions nccl;
      nccl.receive_timeout = plan.options.receive_timeout;
      plan.between_processes = [&links = gpu_links, ranks = plan.rank_of_stage,
                                nccl](const ChannelEnds& ends) {
        return links.channel(ends, ranks, nccl);
      };
    }
    channels = make_ucx_channels(plan);
  } else {
    channels = make_local_channels(d, tied);
  }
  if (!channels) return channels.error();
  st->channels = &*channels;
  const std::vector<int> mine = im.placement.stages_of(im.rank);
  const uint64_t data_start = data.position();
  const ReplicaSplit split{im.config.pipeline.microbatches, eval ? 1 : im.replicas};
  MicrobatchFeed feed(data, im.B, im.T, static_cast<int>(mine.size()), split, im.replica);
  st->feed = &feed;
  st->counters = std::make_unique<StageCounters[]>(static_cast<size_t>(d));
  st->allocate_shortened(d);
  st->cut_request = std::move(cut_request);
  st->spans.resize(static_cast<size_t>(d));
  st->update_spans.resize(static_cast<size_t>(d));
  if (im.options.record_spans) {
    for (int r : mine) st->spans[static_cast<size_t>(r)].reserve(st->actions(r));
  }

  // replicas: each layer's gradients go to the stage's reducer thread as soon as the update's
  // last backward has finished them, so the sum overlaps the rest of the backward
  const bool overlap = st->reducer != nullptr && !im.options.skip_compute;
  if (overlap) {
    im.reducer->take_calls();  // a previous run's
    for (int r : mine) {
      GradientReducer* red = st->reducer;
      // off the host the update's all_reduce sums everything (through host memory)
      if (!workers[static_cast<size_t>(r)]->memory().host_memory()) continue;
      workers[static_cast<size_t>(r)]->on_final_gradients(
          [red, r](int, long step, std::span<float> g) { red->post(r, step, g); });
    }
  }
  // the tensors a stage sends are allocated where their channel lends them without a copy;
  // after the run (however it ends) its channels and their memory go, and the stages' next
  // tensors are in host memory again
  struct EdgeMemory {
    const std::vector<int>& stages;
    std::vector<std::unique_ptr<StageWorker>>& workers;
    ~EdgeMemory() {
      for (int r : stages) workers[static_cast<size_t>(r)]->set_edge_memory(nullptr, nullptr);
    }
  } edge_memory{mine, workers};
  for (int r : mine) {
    workers[static_cast<size_t>(r)]->set_edge_memory(
        r + 1 < d ? channels->send_memory(channel_tag(r, Direction::forward)) : nullptr,
        r > 0 ? channels->send_memory(channel_tag(r - 1, Direction::backward)) : nullptr);
  }
  auto outcome = im.multi() ? run_ranks(*im.group, st) : run_here(st);
  if (overlap) {
    for (int r : mine) workers[static_cast<size_t>(r)]->on_final_gradients({});
  }
  if (!outcome || !outcome->ok) gpu_links.drop();  // a failed run's links may be mid-transfer
  if (!outcome) {
    channels->clear();
    return outcome.error();
  }
  const ChannelTraffic traffic = channels->traffic();
  channels->clear();
  if (!outcome->ok) {
    if (eval) return make_error("{} pipeline, evaluation: {}", to_string(im.mode), outcome->error);
    mb_done += st->total_mbs;
    return make_error("{} pipeline: {}", to_string(im.mode), outcome->error);
  }
  // a stopped run consumed the microbatches of the steps it ran; a process's feed may have read
  // further (stages of other processes get releases ahead), so every loader is put back there
  const int64_t consumed = static_cast<int64_t>(outcome->losses.size()) * st->group;
  AP_CHECK(
      consumed == st->total_mbs || ((outcome->stopped || outcome->cut) && consumed < st->total_mbs),
      "a run of {} microbatches consumed {}", st->total_mbs, consumed);
  if (!eval) mb_done += consumed;
  // the job's position: every replica read its share of the same steps
  if (consumed < st->total_mbs || split.replicas > 1)
    data.seek(data_start + static_cast<uint64_t>(consumed) * static_cast<uint64_t>(split.replicas));
  ActorRunResult result;
  result.stopped = outcome->stopped;
  result.losses = std::move(outcome->losses);
  result.stages = std::move(outcome->stages);
  result.peak_microbatches_ahead = outcome->peak_ahead;
  result.tokens = consumed * st->tokens_per_mb;
  result.seconds = st->seconds_since_start();
  result.tensors_lent = static_cast<int64_t>(traffic.lent);
  result.tensors_copied = static_cast<int64_t>(traffic.copied);
  result.bytes_copied = static_cast<int64_t>(traffic.copied_bytes);
  if (im.options.record_spans) {
    for (auto& spans : st->spans)
      result.spans.insert(result.spans.end(), spans.begin(), spans.end());
    for (auto& spans : st->update_spans)
      result.update_spans.insert(result.update_spans.end(), spans.begin(), spans.end());
    if (overlap) {
      auto since = [&](std::chrono::steady_clock::time_point t) {
        return std::chrono::duration<double>(t - st->start).count();
      };
      for (const ReplicaReducer::Call& c : im.reducer->take_calls())
        result.reduce_spans.push_back({c.stage, c.step, c.floats, since(c.start), since(c.end)});
    }
  }
  return result;
}

long ActorEngine::Impl::updates() const {
  for (const auto& w : workers)
    if (w) return w->updates();
  return 0;
}

Expected<MoveReport> ActorEngine::Impl::move_to(const std::vector<int>& counts) {
  if (multi() && lead() && announcing) {
    // the others learn the verdict first, whatever becomes of it
    if (Status ok = announce(counts); !ok) return ok.error();
    announced = true;
  }
  auto to = Partition::from_counts(model->num_layers(), counts);
  if (!to) return make_error("migration: {}", to.error().message);
  if (Status ok = check_tied_placement(*model, *to, mode); !ok)
    return make_error("migration to [{}]: {}", fmt::join(counts, ", "), ok.error().message);
  auto report = multi() ? move_layers_across(*group, placement, *partition, *to, workers, shards,
                                             moves++, group->options().connect_timeout)
                        : move_layers(*partition, *to, workers, shards);
  if (!report) return report.error();
  *partition = std::move(*to);
  config.pipeline.partition.automatic = false;
  config.pipeline.partition.counts = counts;
  return report;
}

Status ActorEngine::Impl::announce(const std::optional<std::vector<int>>& counts) {
  RankPart part;
  part.text = counts ? fmt::format("move {}", fmt::join(*counts, " ")) : "none";
  auto all = group->all_gather(std::move(part));
  if (!all) return make_error("rank {}: migration verdict: {}", rank, all.error().message);
  return {};
}

Expected<std::optional<std::vector<int>>> ActorEngine::Impl::await_verdict() {
  auto all = group->all_gather({});
  if (!all) return make_error("rank {}: migration verdict: {}", rank, all.error().message);
  const std::string& text = (*all)[static_cast<size_t>(placement.first_rank())].text;
  if (text == "none") return std::optional<std::vector<int>>{};
  std::vector<int> counts;
  if (text.rfind("move", 0) == 0) {
    const char* p = text.data() + 4;
    const char* end = text.data() + text.size();
    while (p < end) {
      while (p < end && *p == ' ') ++p;
      if (p == end) break;
      int c = 0;
      auto [next, ec] = std::from_chars(p, end, c);
      if (ec != std::errc()) break;
      counts.push_back(c);
      p = next;
    }
    if (p == end && !counts.empty()) return std::optional<std::vector<int>>(counts);
  }
  return make_error("rank {}: rank {}'s migration verdict is unreadable: \"{}\"", rank,
                    placement.first_rank(), text);
}

Expected<std::optional<MigrationEvent>> ActorEngine::Impl::ask_manager(long step) {
  std::vector<int32_t> counts;
  for (int c : partition->counts()) counts.push_back(c);
  std::optional<MigrationEvent> out;
  std::string failure;
  caf::scoped_actor self{*migration_system};
  self->request(manager, caf::infinite, internal::boundary_atom::value, static_cast<int64_t>(step),
                counts)
      .receive(
          [&](bool due, MigrationEvent& e) {
            if (due) out = std::move(e);
          },
          [&](caf::error& err) { failure = migration_system->render(err); });
  if (!failure.empty()) return make_error("migration manager: {}", failure);
  return out;
}

Expected<MigrationCheck> ActorEngine::Impl::check(long step) {
  std::vector<int32_t> counts;
  for (int c : partition->counts()) counts.push_back(c);
  // asked from the driver's thread, which may belong to another actor system (a job's): no
  // blocking CAF request from there, the answer comes through the setup
  caf::anon_send(manager, internal::check_atom::value, static_cast<int64_t>(step), counts);
  return migration->replies.take(std::chrono::milliseconds(
      static_cast<int64_t>(std::max(1.0, options.stall_timeout_seconds) * 1000.0)));
}

Expected<std::optional<MigrationEvent>> ActorEngine::Impl::boundary(long step) {
  if (!multi()) return ask_manager(step);
  // the lead rank's manager decides (a move announces itself to the others before it starts);
  // the others follow; then every rank takes the lead's verdict as its own
  caf::actor_system& sys = group->system();
  RankPart verdict;
  if (lead()) {
    announcing = true;
    announced = false;
    auto e = ask_manager(step);
    announcing = false;
    if (!announced) {
      if (Status ok = announce(std::nullopt); !ok) return ok.error();
    }
    std::optional<MigrationEvent> out;
    if (!e) {
      out.emplace();
      out->step = step;
      out->decided = step;
      out->from = partition->counts();
      out->error = e.error().message;
    } else {
      out = std::move(*e);
    }
    if (out) {
      std::vector<char> buf;
      caf::binary_serializer sink{sys, buf};
      if (auto err = sink(*out)) return make_error("migration verdict: {}", sys.render(err));
      verdict.text.assign(buf.begin(), buf.end());
    }
  } else {
    auto counts = await_verdict();
    if (!counts) return counts.error();
    // a failure here is the lead's too (the move's agreement): its verdict names it
    if (*counts) (void)move_to(**counts);
  }
  auto all = group->all_gather(std::move(verdict));
  if (!all) return make_error("rank {}: migration verdict: {}", rank, all.error().message);
  const std::string& text = (*all)[static_cast<size_t>(placement.first_rank())].text;
  if (text.empty()) return std::optional<MigrationEvent>{};
  MigrationEvent e;
  std::vector<char> buf(text.begin(), text.end());
  caf::binary_deserializer source{sys, buf};
  if (auto err = source(e))
    return make_error("rank {}: the migration verdict is unreadable: {}", rank, sys.render(err));
  return std::optional<MigrationEvent>(std::move(e));
}

Expected<EvalResult> ActorEngine::evaluate(DataLoader& data, int microbatches) {
  if (microbatches < 1)
    return make_error("actor engine: evaluate {} microbatches, expected >= 1", microbatches);
  if (impl_->options.skip_compute)
    return make_error("actor engine: no evaluation with skip_compute (nothing is computed)");
  ActorCallbacks none;
  auto r = impl_->run_segment(1, data, none, microbatches);
  if (!r) return r.error();
  EvalResult e = combine_eval_losses(r->losses, int64_t{impl_->B} * impl_->T);
  e.seconds = r->seconds;
  eval_spans_ = std::move(r->spans);
  return e;
}

Expected<ActorRunResult> ActorEngine::run(int steps, DataLoader& data,
                                          const ActorCallbacks& callbacks) {
  if (steps < 1) return make_error("actor engine: steps = {}, expected >= 1", steps);
  Impl& im = *impl_;
  if (!im.migration) return im.run_segment(steps, data, callbacks);

  // Segments: the run ends at every forced move's step, and the manager makes the move while
  // every stage is idle. The automatic rule's checks run during a segment, from the driver's
  // report of each check step; a check that decides to move has the driver end the run after
  // the step in flight (RunState::cut_request), and the move is made there.
  const auto started = std::chrono::steady_clock::now();
  auto since_start = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  ActorRunResult total;
  auto record = [&](MigrationEvent e) -> Status {
    if (callbacks.on_migration) callbacks.on_migration(e);
    total.migrations.push_back(e);
    if (!e.error.empty())
      return make_error("{} pipeline: migration after step {}: {}", to_string(im.mode), e.step,
                        e.error);
    return {};
  };
  long u = im.updates();
  if (im.first_run) {
    // a run that starts past forced moves (a resume) takes the layout they had reached
    const ForcedMove* last = nullptr;
    for (const ForcedMove& m : im.migration->forced)
      if (m.step <= u) last = &m;
    if (last != nullptr && last->counts != im.partition->counts()) {
      MigrationEvent e;
      e.step = u;
      e.decided = u;
      e.forced = true;
      e.from = im.partition->counts();
      e.reason = fmt::format(
          "forced by migration.moves: the layout of step {}, which this run starts past",
          last->step);
      move_and_report(*im.migration, last->counts, e);  // the manager is idle between runs
      if (Status ok = record(std::move(e)); !ok) return ok.error();
    }
  }
  im.first_run = false;
  const long end = u + steps;
  int done = 0;
  while (u < end) {
    const long next = next_migration_boundary(*im.migration, u, end);
    const int seg = static_cast<int>(next - u);
    const long seg_start = u;
    const double offset = since_start();
    const std::vector<StageTimes> before = total.stages;
    const int64_t tokens_before = total.tokens;
    auto cut = std::make_shared<std::atomic<bool>>(false);
    Status checked;  // a check that failed: the run is cut short and ends with it
    ActorCallbacks cb;
    cb.stop = callbacks.stop;
    cb.on_step = [&](const StepProgress& p) {
      if (im.manager) caf::anon_send(im.manager, internal::steptimes_atom::value, p.stages);
      if (callbacks.on_step) {
        StepProgress q = p;
        q.step += done;
        q.steps = steps;
        q.tokens += tokens_before;
        q.seconds += offset;
        for (size_t r = 0; r < q.stages.size() && r < before.size(); ++r) q.stages[r] += before[r];
        callbacks.on_step(q);
      }
      const long step = seg_start + p.step;
      if (!im.manager || !im.migration->policy || step % im.migration->check_every != 0 || !checked)
        return;
      auto verdict = im.check(step);
      if (!verdict) {
        checked = verdict.error();
      } else if (verdict->move) {
        cut->store(true);
      } else if (verdict->report) {
        checked = record(std::move(verdict->event));
      }
      if (!checked) cut->store(true);
    };
    if (im.manager) caf::anon_send(im.manager, internal::segment_atom::value);
    auto r = im.run_segment(seg, data, cb, 0, cut);
    if (!r) return r.error();
    const int ran = static_cast<int>(r->losses.size());
    total.losses.insert(total.losses.end(), r->losses.begin(), r->losses.end());
    total.stages.resize(r->stages.size());
    for (size_t k = 0; k < r->stages.size(); ++k) total.stages[k] += r->stages[k];
    // spans count from the run's start, not the segment's
    auto shifted = [offset](std::vector<ActionSpan>& from, std::vector<ActionSpan>& into) {
      for (ActionSpan a : from) {
        a.start += offset;
        a.end += offset;
        into.push_back(a);
      }
    };
    shifted(r->spans, total.spans);
    shifted(r->update_spans, total.update_spans);
    total.peak_microbatches_ahead =
        std::max(total.peak_microbatches_ahead, r->peak_microbatches_ahead);
    total.tokens += r->tokens;
    if (r->stopped) {
      // asked to stop: no migration, no further segment
      total.stopped = true;
      break;
    }
    done += ran;
    u += ran;
    // every process ends the segment here: a forced move, a move a check decided, or nothing
    auto event = im.boundary(u);
    if (!event) return event.error();
    if (!checked) return checked.error();
    if (*event) {
      if (Status ok = record(std::move(**event)); !ok) return ok.error();
    }
  }
  total.seconds = since_start();
  return total;
}

Expected<ActorTrainResult> run_actor_pipeline(const Config& config,
                                              const ActorEngineOptions& options,
                                              const ActorCallbacks& callbacks) {
  auto engine = ActorEngine::create(config, options);
  if (!engine) return engine.error();
  const int T = config.pipeline.seq_len > 0 ? config.pipeline.seq_len : config.model.context;
  auto data = DataLoader::open(config.data, config.model.arch, config.model.vocab_size,
                               config.pipeline.microbatch_size, T);
  if (!data) return data.error();
  auto run = (*engine)->run(config.train.steps, **data, callbacks);
  if (!run) return run.error();
  ActorTrainResult out;
  out.run = std::move(*run);
  for (int i = 0; i < (*engine)->config().model.depth + 2; ++i) {
    auto p = (*engine)->params(i);
    out.params.emplace_back(p.begin(), p.end());
  }
  return out;
}

}  // namespace actorpipe
