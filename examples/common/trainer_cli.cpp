// Trainer command line: argument parsing, config loading (embedded default or --config, then
// --set), a Trainer with a progress printer, and one-line errors with distinct exit codes.
#include "examples/common/trainer_cli.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <thread>

#include "actors/api/actorpipe/progress.hpp"
#include "actors/api/actorpipe/trainer.hpp"
#include "actors/process_group.hpp"
#include "actors/supervisor.hpp"
#include "engine/checkpoint/checkpoint.hpp"
#include "engine/config/config.hpp"
#include "engine/devices/stage_devices.hpp"
#include "engine/model/partition.hpp"
#include "engine/model/placement.hpp"
#include "engine/stop_flag.hpp"
#include "kernels/bf16_gemm.hpp"
#include "kernels/blas_core.hpp"
#include "kernels/device.hpp"
#include "transport/failure_record.hpp"

namespace actorpipe {
namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

// "name: error: first line" and the following lines of a multi-line message indented.
void print_error(std::string_view program, const std::string& message) {
  std::string text = message;
  for (size_t p = text.find('\n'); p != std::string::npos; p = text.find('\n', p + 3)) {
    text.replace(p, 1, "\n  ");
  }
  fmt::print(stderr, "{}: error: {}\n", program, text);
}

std::string_view arch_name(Arch a) {
  return a == Arch::gpt ? "gpt" : "bert";
}

// SIGINT / SIGTERM while training: the first asks the trainer to stop after its step in flight
// (Trainer::request_stop, lock-free atomics only) and puts both signals back to their default
// action, so a second one ends the process at once.
std::atomic<Trainer*> g_stoppable{nullptr};

extern "C" void on_stop_signal(int sig) {
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGINT, &dfl, nullptr);
  ::sigaction(SIGTERM, &dfl, nullptr);
  if (Trainer* t = g_stoppable.load()) t->request_stop(sig);
}

// Installs on_stop_signal for `trainer` until destroyed (then the default actions again).
class StopOnSignal {
 public:
  explicit StopOnSignal(Trainer& trainer) {
    g_stoppable.store(&trainer);
    struct sigaction sa = {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
  }
  ~StopOnSignal() {
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGINT, &dfl, nullptr);
    ::sigaction(SIGTERM, &dfl, nullptr);
    g_stoppable.store(nullptr);
  }
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;
};

// The exit code of a training stopped on a signal: 128 + the signal (130 SIGINT, 143 SIGTERM);
// a rank > 0 stopped with its job but without a signal of its own: 143.
// OpenBLAS's kernels, chosen again at the start where it picked narrower ones than the CPU has
// (use_fitting_blas_core): what was done, once per process.
const std::string& blas_switch() {
  static const std::string done = use_fitting_blas_core();
  return done;
}

int stopped_exit_code(const Trainer& t) {
  return 128 + (t.stop_signal() > 0 ? t.stop_signal() : SIGTERM);
}

// "stopped by SIGTERM after step 37 of 100; checkpoint ckpt/step-37; resume with --set
// checkpoint.resume=ckpt" (or that nothing was saved).
std::string stopped_message(const Trainer& t) {
  const Config& c = t.config();
  const int sig = t.stop_signal();
  std::string by = sig <= 0 ? "with the job" : "by " + signal_name(sig);
  std::string out =
      fmt::format("stopped {} after step {} of {}", by, t.step_count(), c.train.steps);
  if (c.checkpoint.dir.empty()) {
    out += "; nothing saved (no checkpoint.dir): set checkpoint.dir to keep a run's progress";
  } else {
    out += fmt::format("; checkpoint {}; resume with --set checkpoint.resume={}",
                       t.last_checkpoint(), c.checkpoint.dir);
  }
  if (!c.train.metrics.empty()) out += fmt::format("; metrics {}", c.train.metrics);
  return out;
}

// A relaunch of a failed job by actorpipe-launch --max-restarts: ACTORPIPE_RESTART=k (k >= 1),
// ACTORPIPE_MAX_RESTARTS and ACTORPIPE_RESTART_REASON; none set: a first start.
Expected<std::optional<TrainerRestart>> relaunch_from(const EnvLookup& env) {
  const char* k = env("ACTORPIPE_RESTART");
  if (k == nullptr) return std::optional<TrainerRestart>{};
  auto number = [&](const char* name, const char* text) -> Expected<int> {
    char* end = nullptr;
    errno = 0;
    const long v = text != nullptr ? std::strtol(text, &end, 10) : -1;
    if (text == nullptr || *text == '\0' || *end != '\0' || errno != 0 || v < 0 || v > 1000)
      return make_error("{}=\"{}\": expected an integer from 0 to 1000 (set by actorpipe-launch)",
                        name, text != nullptr ? text : "");
    return static_cast<int>(v);
  };
  TrainerRestart r;
  auto restart = number("ACTORPIPE_RESTART", k);
  if (!restart) return restart.error();
  if (*restart == 0) return std::optional<TrainerRestart>{};
  auto max = number("ACTORPIPE_MAX_RESTARTS", env("ACTORPIPE_MAX_RESTARTS"));
  if (!max) return max.error();
  r.restart = *restart;
  r.max_restarts = *max;
  const char* reason = env("ACTORPIPE_RESTART_REASON");
  r.error = reason != nullptr ? reason : "";
  return std::optional<TrainerRestart>{r};
}

// actorpipe-launch --max-restarts K relaunches only the ranks that died and sets
// ACTORPIPE_REJOIN=K in every rank: a rank whose part of the run fails while its process lives on
// rejoins the job (the job's restarts up to K in all, counted from ACTORPIPE_RESTART). Unset: 0.
Expected<int> rejoin_limit(const EnvLookup& env) {
  const char* k = env("ACTORPIPE_REJOIN");
  if (k == nullptr) return 0;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(k, &end, 10);
  if (*k == '\0' || *end != '\0' || errno != 0 || v < 0 || v > 1000)
    return make_error(
        "ACTORPIPE_REJOIN=\"{}\": expected an integer from 0 to 1000 (set by "
        "actorpipe-launch)",
        k);
  return static_cast<int>(v);
}

// Bounds the teardown of a failed attempt in a job of several processes: if leaving the failed
// run's process group (its actors, UCX endpoints and connections to a lost rank) takes longer
// than `limit` once armed, the process says so and exits 1 (a rank to be rejoined: so that
// actorpipe-launch relaunches it instead of the job waiting for it; any other: the process
// fails anyway, and a lost peer must not keep it alive).
// How long a failed process of a job may take to leave before TeardownWatchdog ends it.
constexpr std::chrono::milliseconds kFailedTeardownLimit{5000};

class TeardownWatchdog {
 public:
  TeardownWatchdog() = default;
  TeardownWatchdog(const TeardownWatchdog&) = delete;
  TeardownWatchdog& operator=(const TeardownWatchdog&) = delete;
  ~TeardownWatchdog() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void arm(std::string program, int rank, std::chrono::milliseconds limit, bool relaunched) {
    if (thread_.joinable()) return;
    thread_ = std::thread([this, program = std::move(program), rank, limit, relaunched] {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, limit, [this] { return done_; })) return;
      fmt::print(stderr, "{}: rank {}: leaving the failed run took longer than {:.0f} s; {}\n",
                 program, rank, std::chrono::duration<double>(limit).count(),
                 relaunched ? "exiting so that actorpipe-launch relaunches this rank"
                            : "exiting without waiting for it");
      std::fflush(stderr);
      std::_Exit(kExitError);
    });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// How one attempt of this process's part of the training ended.
struct Attempt {
  int code = 0;             // the exit code, when nothing follows
  bool may_rejoin = false;  // its run (or a rejoin's trainer) failed, not on a signal
  std::string error;
  long step = -1;          // the step the training had reached; -1: no trainer was made
  bool peer_lost = false;  // another rank of the job was lost when it failed
  bool on_signal = false;  // it failed while stopping on a signal
};

std::string partition_text(const std::vector<int>& counts) {
  std::string s = "[";
  for (size_t i = 0; i < counts.size(); ++i) s += (i ? ", " : "") + std::to_string(counts[i]);
  return s + "]";
}

// The prompt as token ids: the bytes of a text corpus's prompt, ids otherwise ("3 17 5", "3,17").
Expected<std::vector<int32_t>> prompt_tokens(const Config& c, const SampleArgs& s) {
  std::vector<int32_t> out;
  if (c.data.kind == "text") {
    const std::string text = s.prompt_given ? s.prompt : std::string("\n");
    for (unsigned char ch : text) out.push_back(ch);
    if (out.empty()) return make_error("--prompt \"\": the prompt needs at least one byte");
    return out;
  }
  const std::string text = s.prompt_given ? s.prompt : std::string("0");
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ' || text[i] == ',') {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
    if (end == i || end - i > 9)
      return make_error(
          "--prompt \"{}\": expected token ids such as \"3 17 5\" (data.kind = \"{}\")", text,
          c.data.kind);
    out.push_back(static_cast<int32_t>(std::stol(text.substr(i, end - i))));
    i = end;
  }
  if (out.empty())
    return make_error("--prompt \"{}\": the prompt needs at least one token id", text);
  return out;
}

// --sample: the tokens after the prompt, from the checkpoint's weights.
int sample_main(const TrainerProgram& program, const Config& c, const SampleArgs& s) {
  if (program.arch != Arch::gpt) {
    print_error(program.name,
                "--sample: a BERT model fills in masked tokens and generates no "
                "text; sample from a GPT with actorpipe-gpt");
    return kExitUsage;
  }
  const std::string checkpoint = !s.checkpoint.empty()          ? s.checkpoint
                                 : !c.checkpoint.resume.empty() ? c.checkpoint.resume
                                                                : c.checkpoint.dir;
  if (checkpoint.empty()) {
    print_error(program.name,
                "--sample needs a checkpoint: --checkpoint DIR, or "
                "checkpoint.resume or checkpoint.dir in the config");
    return kExitUsage;
  }
  auto prompt = prompt_tokens(c, s);
  if (!prompt) {
    print_error(program.name, prompt.error().message);
    return kExitUsage;
  }
  // pipeline.device: the whole model on the first stage's device
  PipelineOptions on = c.pipeline;
  if (!on.device_ids.empty()) on.device_ids = std::vector<int>{c.pipeline.device_ids.front()};
  auto devices = StageDevices::open(on, 1);
  if (!devices) {
    print_error(program.name, fmt::format("--sample: {}", devices.error().message));
    return kExitError;
  }
  ComputeBackend* backend = devices->backends().empty() ? nullptr : devices->backends()[0];
  auto sampler = Sampler::from_checkpoint(c.model, checkpoint, backend);
  if (!sampler) {
    print_error(program.name, fmt::format("--sample: {}", sampler.error().message));
    return kExitError;
  }
  auto tokens = (*sampler)->generate(*prompt, s.options);
  if (!tokens) {
    print_error(program.name, fmt::format("--sample: {}", tokens.error().message));
    return kExitError;
  }
  fmt::print(stderr, "{}: {} tokens from {}{} (temperature {}, top-k {}, seed {})\n", program.name,
             s.options.tokens, (*sampler)->source(),
             backend != nullptr ? " on " + (*sampler)->device() : std::string(),
             s.options.temperature, s.options.top_k, s.options.seed);
  if (c.data.kind == "text") {
    std::string text;
    for (int32_t t : *tokens) text += static_cast<char>(t < 256 ? t : '?');
    fmt::print("{}\n", text);
  } else {
    fmt::print("{}\n", fmt::join(*tokens, " "));
  }
  return 0;
}

}  // namespace

Expected<CliArgs> parse_cli(int argc, const char* const* argv) {
  CliArgs args;
  // --name VALUE or --name=VALUE; `i` moves past a separate value
  auto value_of = [&](int& i, std::string_view flag, std::string& out) -> Expected<bool> {
    const std::string_view a = argv[i];
    if (a == flag) {
      if (i + 1 >= argc) return make_error("{} needs a value", flag);
      out = argv[++i];
      return true;
    }
    if (a.size() > flag.size() && a.substr(0, flag.size()) == flag && a[flag.size()] == '=') {
      out = std::string(a.substr(flag.size() + 1));
      return true;
    }
    return false;
  };
  bool have_config = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    std::string value;
    if (a == "--help" || a == "-h") {
      args.help = true;
      continue;
    }
    if (a == "--print-config") {
      args.print_config = true;
      continue;
    }
    auto cfg = value_of(i, "--config", value);
    if (!cfg) return cfg.error();
    if (*cfg) {
      if (have_config)
        return make_error("--config given twice (\"{}\" and \"{}\")", args.config_path, value);
      if (value.empty()) return make_error("--config needs a file name");
      have_config = true;
      args.config_path = value;
      continue;
    }
    auto set = value_of(i, "--set", value);
    if (!set) return set.error();
    if (*set) {
      const size_t eq = value.find('=');
      const size_t dot = value.find('.');
      if (eq == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 >= eq) {
        return make_error("--set \"{}\": expected section.key=value, e.g. --set pipeline.mode=2bw",
                          value);
      }
      args.sets.push_back(value);
      continue;
    }
    bool cluster_flag = false;
    for (auto [flag, slot] : {std::pair{"--rank", &args.cluster.rank},
                              {"--world", &args.cluster.world},
                              {"--coordinator", &args.cluster.coordinator}}) {
      auto f = value_of(i, flag, value);
      if (!f) return f.error();
      if (*f) {
        if (slot->has_value()) return make_error("{} given twice", flag);
        *slot = value;
        cluster_flag = true;
        break;
      }
    }
    if (cluster_flag) continue;
    if (a == "--sample") {
      args.sample.enabled = true;
      continue;
    }
    bool sample_flag = false;
    for (const char* flag :
         {"--checkpoint", "--prompt", "--tokens", "--temperature", "--top-k", "--seed"}) {
      auto f = value_of(i, flag, value);
      if (!f) return f.error();
      if (!*f) continue;
      sample_flag = true;
      const std::string_view name = flag;
      auto number = [&](double lo, double hi) -> Expected<double> {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || errno != 0 || !(v >= lo && v <= hi))
          return make_error("{} \"{}\": expected a number from {} to {}", name, value, lo, hi);
        return v;
      };
      SampleArgs& sa = args.sample;
      if (name == "--checkpoint") {
        sa.checkpoint = value;
      } else if (name == "--prompt") {
        sa.prompt = value;
        sa.prompt_given = true;
      } else if (name == "--temperature") {
        auto v = number(0.0, 1e6);
        if (!v) return v.error();
        sa.options.temperature = *v;
      } else {
        auto v = number(0.0, name == "--seed" ? 9.0e15 : 1e9);
        if (!v) return v.error();
        if (*v != std::floor(*v))
          return make_error("{} \"{}\": expected a whole number", name, value);
        if (name == "--tokens") sa.options.tokens = static_cast<int>(*v);
        if (name == "--top-k") sa.options.top_k = static_cast<int>(*v);
        if (name == "--seed") sa.options.seed = static_cast<uint64_t>(*v);
      }
      break;
    }
    if (sample_flag) continue;
    auto backend = value_of(i, "--backend", value);
    if (!backend) return backend.error();
    if (*backend) {
      if (auto b = parse_backend(value); !b) return make_error("--backend: {}", b.error().message);
      args.backend = value;
      continue;
    }
    return make_error("unknown argument \"{}\" (see --help)", a);
  }
  if (!args.sample.enabled &&
      (!args.sample.checkpoint.empty() || args.sample.prompt_given ||
       args.sample.options.tokens != SampleOptions{}.tokens ||
       args.sample.options.temperature != SampleOptions{}.temperature ||
       args.sample.options.top_k != 0 || args.sample.options.seed != SampleOptions{}.seed)) {
    return make_error(
        "--checkpoint, --prompt, --tokens, --temperature, --top-k and --seed are options of "
        "--sample");
  }
  return args;
}

std::string cli_usage(const TrainerProgram& p) {
  return fmt::format(
      R"(usage: {0} [--config FILE] [--set section.key=value]... [--backend actors|serial]
          [--rank R --world W] [--coordinator HOST:PORT]
       {0} --print-config [--config FILE] [--set ...]
       {0} --sample [--config FILE] [--set ...] [--checkpoint DIR] [--prompt TEXT]
          [--tokens N] [--temperature T] [--top-k K] [--seed S]

Trains a {1} model with pipeline parallelism. Without --config, an embedded default config is
used (--print-config shows it); each --set overrides one key of it, e.g.
  --set pipeline.mode=2bw --set pipeline.stages=2 --set train.steps=50
Keys (docs/config.md): model.*, data.*, pipeline.*, optimizer.*, train.*, checkpoint.*, cluster.*.
  train.metrics = FILE     JSON lines: step, loss, tokens, time, per-stage busy and idle seconds
  train.trace = FILE       Chrome/Perfetto trace: one track per stage, one span per action
  checkpoint.dir = DIR     checkpoints DIR/step-<N> every checkpoint.every steps and DIR/final
  checkpoint.resume = P    continue from a checkpoint, DIR/final, or DIR (its latest)
  eval.every = N           held-out loss every N steps and at the end (data.holdout for a file)
--backend serial runs the serial reference executor (same results, one thread, no trace).
--sample generates text from a checkpoint (--checkpoint, else checkpoint.resume, else the newest
in checkpoint.dir) of the model the config describes: --tokens N (200) after --prompt (data.kind
text: the prompt's bytes, default a newline; otherwise token ids "3 17 5", default "0"), drawn
with --temperature T (1; 0 = greedy) among the --top-k K most likely (0 = all), from --seed S (1).
The text goes to stdout (token ids space-separated for a non-text corpus); GPT only.
Several processes: start them with actorpipe-launch -n N -- {0} ..., mpirun, srun or torchrun,
or give --rank, --world and --coordinator (the job secret comes from ACTORPIPE_JOB_SECRET or
ACTORPIPE_JOB_SECRET_FILE, never the command line); docs/cluster.md.
SIGINT or SIGTERM: the training ends after its step in flight (2bw, pipedream, xpipe: at the end
of the current run, a multiple of checkpoint.every), writes a checkpoint (checkpoint.dir set), the
metrics and the trace, says how to resume and exits 128 + the signal; a second signal ends it at
once (docs/failures.md).
Exit codes: 0 done, 1 config, data, checkpoint or training error, 2 bad argument, 130 / 143
stopped by SIGINT / SIGTERM.
)",
      p.name, p.arch == Arch::gpt ? "GPT" : "BERT");
}

namespace {

// One attempt of this process's part of the training: joins the job (several processes), builds
// the trainer, trains and leaves. A failure after the job was formed may be rejoined. `rejoining`:
// a relaunched process or one that lives on after a failure; `lived_on`: the latter;
// `may_rejoin_later`: this process outlives a failure of the job (ACTORPIPE_REJOIN).
Attempt train_in_job(const TrainerProgram& program, Config config, TrainerOptions options,
                     const ClusterEnv& cluster, const std::string& secret, bool rejoining,
                     bool lived_on, bool may_rejoin_later) {
  TeardownWatchdog watchdog;  // destroyed after the trainer and the group
  std::unique_ptr<ProcessGroup> group;
  std::unique_ptr<Trainer> trainer;
  auto failed = [&](const std::string& error, bool may_rejoin) {
    print_error(program.name, error);
    if (may_rejoin && may_rejoin_later) {
      watchdog.arm(std::string(program.name), cluster.rank,
                   std::chrono::milliseconds(
                       static_cast<int64_t>(config.cluster.peer_timeout * 1000.0) + 5000),
                   true);
    } else if (cluster.multi_process()) {
      // the error is out; what is left is teardown, which normally takes about a second
      watchdog.arm(std::string(program.name), cluster.rank, kFailedTeardownLimit, false);
    }
    Attempt a{kExitError, may_rejoin, error};
    a.step = trainer ? trainer->step_count() : -1;
    a.on_signal = trainer && trainer->stop_signal() > 0;
    // (the group's watcher may not have seen the loss yet when a stage's wait ended with it)
    a.peer_lost =
        (group && group->lost().has_value()) || error.find(" was lost") != std::string::npos;
    return a;
  };
  if (cluster.multi_process()) {
    ProcessGroupOptions po;
    po.rank = cluster.rank;
    po.world = cluster.world;
    po.coordinator_host = cluster.coordinator_host;
    po.coordinator_port = cluster.coordinator_port;
    po.secret = secret;
    po.rejoin = rejoining;
    po.bind = config.cluster.bind;
    po.tls_certificate = config.cluster.tls_certificate;
    po.tls_key = config.cluster.tls_key;
    po.tls_ca = config.cluster.tls_ca;
    po.connect_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(config.cluster.connect_timeout * 1000.0));
    po.peer_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(config.cluster.peer_timeout * 1000.0));
    auto g = ProcessGroup::create(po);
    if (!g) return failed(g.error().message, false);
    group = std::move(*g);
    options.group = group.get();
  }
  const bool reports = !group || group->rank() == 0;
  try {
    auto created = Trainer::create(config, options);
    // a rejoin's trainer may fail for the job's sake (another rank lost while they agree)
    if (!created) return failed(created.error().message, rejoining);
    trainer = std::move(*created);
  } catch (const std::exception& e) {
    return failed(e.what(), rejoining);
  }

  const Config& c = trainer->config();
  const int T = c.pipeline.seq_len > 0 ? c.pipeline.seq_len : c.model.context;
  if (!reports) {
    // rank > 0: its stages compute; rank 0 prints progress and the summary
    Status done;
    {
      StopOnSignal stop_on_signal(*trainer);
      try {
        done = trainer->train();
      } catch (const std::exception& e) {
        done = Error{e.what()};
      }
    }
    if (!done) return failed(done.error().message, trainer->stop_signal() < 0);
    if (Status left = group->leave(); !left) return failed(left.error().message, false);
    return Attempt{trainer->stopped() ? stopped_exit_code(*trainer) : 0, false, {}};
  }
  fmt::print("{}: {} with {} blocks, width {}, {} heads, {} parameters\n", program.name,
             arch_name(c.model.arch), c.model.depth, c.model.width, c.model.heads,
             trainer->parameter_count());
  fmt::print(
      "pipeline: {} mode, {} stages {}{}, {} microbatches of {}x{} tokens per step, {} "
      "backend\n",
      c.pipeline.mode, trainer->stages(), partition_text(trainer->partition()),
      config.pipeline.partition.automatic ? " (auto: the planner's, see actorpipe-plan)" : "",
      c.pipeline.microbatches, c.pipeline.microbatch_size, T, to_string(options.backend));
  if (config.pipeline.replicas == 0 && group) {
    fmt::print(
        "plan: the planner chose pipeline.replicas = {}, pipeline.stages = {}, "
        "pipeline.partition = {} for the job's {} processes (pipeline.replicas = 0; see "
        "actorpipe-plan --ranks {})\n",
        c.pipeline.replicas, c.pipeline.stages, partition_text(trainer->partition()),
        group->world(), group->world());
  }
  // the resolved layers ("auto" became the planner's list, or none)
  if (auto flags = recompute_flags(c.pipeline.recompute, c.model.depth + 2); flags) {
    const std::vector<int> layers = recomputed_layers(*flags);
    const bool automatic = config.pipeline.recompute.kind == RecomputeSpec::Kind::automatic;
    if (!layers.empty() || automatic) {
      fmt::print("recompute: {}{}\n",
                 layers.empty() ? std::string("none")
                                : fmt::format("layers {{{}}}", fmt::join(layers, ", ")),
                 automatic ? fmt::format(" (auto: the planner's under pipeline.memory_limit_mb = "
                                         "{}, see actorpipe-plan)",
                                         c.pipeline.memory_limit_mb)
                           : "");
    }
  }
  if (group) {
    // the trainer exists: every replica's placement is valid
    std::vector<std::string> placed;
    for (int q = 0; q < c.pipeline.replicas; ++q) {
      auto p = Placement::make(c.cluster.placement, c.pipeline.stages, group->world(),
                               c.pipeline.replicas, q);
      placed.push_back(p ? partition_text(p->ranks()) : p.error().message);
    }
    fmt::print("cluster: {}, stages on ranks {}{}\n", cluster.describe(), fmt::join(placed, " / "),
               c.pipeline.replicas > 1
                   ? fmt::format(" ({} replicas, gradients summed with Gloo)", c.pipeline.replicas)
                   : std::string());
  }
  fmt::print("data: {}\n", trainer->data_description());
  std::string bf16_note;
  std::string bf16_warning;
  if (c.pipeline.precision == "bf16") {
    const Bf16Speed speed = measure_bf16_speed();
    bf16_note = fmt::format(" ({}, measured: {})", bf16_support().describe(), speed.describe());
    bf16_warning = speed.slowdown_warning();
  }
  // "CPU, 1 thread(s) per stage, ..." or "stage 0: cuda:0 (...); stage 1: ...; 1 thread(s) ..."
  const std::string where = trainer->devices();
  fmt::print("devices: {}{} {} thread(s) per stage, {} matrix products{}; {}\n", where,
             where == "CPU" ? "," : ";", c.pipeline.threads_per_stage, c.pipeline.precision,
             bf16_note, probe_devices().status);
  if (!bf16_warning.empty()) fmt::print("{}: warning: {}\n", program.name, bf16_warning);
  // the CPU's fp32 products (every stage not on a GPU) on OpenBLAS kernels narrower than the CPU
  if (c.pipeline.device != "cuda" && !blas_switch().empty())
    fmt::print("{}: {}\n", program.name, blas_switch());
  if (c.pipeline.device != "cuda" && !blas_core().warning().empty())
    fmt::print("{}: warning: {}\n", program.name, blas_core().warning());
  const std::optional<double> floor = trainer->loss_floor();
  if (floor) fmt::print("loss floor (entropy rate of the data): {:.4f} nats/token\n", *floor);
  if (const auto& r = options.relaunched) {
    fmt::print("{} {} of {} (actorpipe-launch --max-restarts) after: {}\n",
               lived_on ? "rejoin" : "relaunch", r->restart, r->max_restarts, r->error);
  }
  for (const std::string& s : trainer->skipped_checkpoints())
    fmt::print(stderr, "{}: warning: skipped a newer checkpoint that does not load: {}\n",
               program.name, s);
  if (!trainer->resumed_from().empty()) {
    fmt::print("resumed from {} at step {}\n", trainer->resumed_from(), trainer->step_count());
  }
  std::fflush(stdout);

  ProgressPrinter printer(stdout, isatty(fileno(stdout)) != 0, c.train.log_every, floor);
  trainer->on_step([&](const StepMetrics& m) { printer.step(m); });
  trainer->on_migration([&](const MigrationEvent& e) {
    if (e.moved) {
      const std::string sent = e.bytes_sent > 0
                                   ? fmt::format(" ({:.1f} MiB between processes)",
                                                 static_cast<double>(e.bytes_sent) / (1 << 20))
                                   : std::string();
      printer.note(fmt::format(
          "migration after step {}: {} -> {}, {} layer(s), {:.1f} MiB moved{} in {:.1f} ms ({})",
          e.step, partition_text(e.from), partition_text(e.to), e.layers_moved,
          static_cast<double>(e.bytes_moved) / (1 << 20), sent, e.move_seconds * 1e3, e.reason));
    } else if (e.reason.rfind("balanced", 0) != 0) {
      printer.note(fmt::format("migration check after step {}: {}", e.step, e.reason));
    }
  });
  trainer->on_eval([&](const EvalMetrics& e) {
    printer.note(fmt::format(
        "eval after step {}: held-out loss {:.4f}{}, {} microbatches in {:.3f} s", e.step, e.loss,
        floor ? fmt::format(" (floor {:.4f})", *floor) : std::string(), e.microbatches, e.seconds));
  });
  trainer->on_restart([&](const TrainerRestart& r) {
    printer.note(fmt::format(
        "restart {} of {} (train.max_restarts) after {:.1f} s: {}; continuing from {} at step {}",
        r.restart, r.max_restarts, r.waited, r.error,
        r.resumed_from.empty() ? std::string("the start") : r.resumed_from, r.step));
  });
  Status done;
  std::optional<StopOnSignal> stop_on_signal(std::in_place, *trainer);
  try {
    done = trainer->train();
  } catch (const std::bad_alloc&) {
    done = Error{
        "out of memory (std::bad_alloc) while training: the activations, stashes and buffers of "
        "this config do not fit beside the weights; lower pipeline.microbatch_size or "
        "pipeline.microbatches, set pipeline.recompute, or use more stages"};
  } catch (const std::exception& e) {
    done = Error{e.what()};
  }
  stop_on_signal.reset();
  printer.finish();
  if (!done) return failed(done.error().message, trainer->stop_signal() < 0);
  if (trainer->stopped()) {
    fmt::print("{}\n", stopped_message(*trainer));
    if (!c.train.trace.empty()) fmt::print("trace {}\n", c.train.trace);
    std::fflush(stdout);
    if (group) {
      if (Status left = group->leave(); !left) return failed(left.error().message, false);
    }
    return Attempt{stopped_exit_code(*trainer), false, {}};
  }

  const StepMetrics& last = trainer->last_metrics();
  std::string summary = fmt::format("done: step {}", last.step);
  if (last.step > last.first_step) {
    summary += fmt::format(" in {}, loss {:.4f}", format_duration(last.seconds), last.loss);
    if (floor) summary += fmt::format(" (floor {:.4f})", *floor);
    summary += fmt::format(", {} tok/s", format_rate(last.tokens_per_second()));
  }
  if (const auto& e = trainer->last_eval())
    summary += fmt::format(", held-out loss {:.4f} at step {}", e->loss, e->step);
  if (!c.checkpoint.dir.empty()) summary += fmt::format("; checkpoints in {}", c.checkpoint.dir);
  if (!c.train.metrics.empty()) summary += fmt::format("; metrics {}", c.train.metrics);
  if (!c.train.trace.empty()) summary += fmt::format("; trace {}", c.train.trace);
  fmt::print("{}\n", summary);
  if (group) {
    // how the tensors went between the processes (cluster.shared_memory)
    const TensorTransfers& t = trainer->transfers();
    if (t.lent + t.copied > 0)
      fmt::print("tensors to other processes: {} lent in shared memory, {} copied ({:.1f} MiB)\n",
                 t.lent, t.copied, static_cast<double>(t.bytes_copied) / (1 << 20));
  }
  if (group) {
    if (Status left = group->leave(); !left) return failed(left.error().message, false);
  }
  return Attempt{};
}

}  // namespace

int trainer_main(int argc, const char* const* argv, const TrainerProgram& program) {
  (void)blas_switch();  // before any thread computes
  auto args = parse_cli(argc, argv);
  if (!args) {
    print_error(program.name, args.error().message);
    return kExitUsage;
  }
  if (args->help) {
    fmt::print("{}", cli_usage(program));
    return 0;
  }
  auto config = args->config_path.empty() ? config_from_string(program.default_config, args->sets)
                                          : load_config(args->config_path, args->sets);
  if (!config) {
    print_error(program.name, config.error().message);
    return kExitError;
  }
  if (config->model.arch != program.arch) {
    print_error(program.name,
                fmt::format("model.arch = \"{}\": {} trains {} models (use actorpipe-{})",
                            arch_name(config->model.arch), program.name, arch_name(program.arch),
                            arch_name(config->model.arch)));
    return kExitError;
  }
  if (args->print_config) {
    fmt::print("{}", to_toml(*config));
    return 0;
  }
  if (args->sample.enabled) {
    // a device out of memory, or any other failure inside: an error, not std::terminate
    try {
      return sample_main(program, *config, args->sample);
    } catch (const std::exception& e) {
      print_error(program.name, fmt::format("--sample: {}", e.what()));
      return kExitError;
    }
  }

  TrainerOptions options;
  options.backend = *parse_backend(args->backend);
  // relaunched after a failure: continue from the checkpoint directory when it holds one
  auto relaunch = relaunch_from(process_environment());
  if (!relaunch) {
    print_error(program.name, relaunch.error().message);
    return kExitUsage;
  }
  options.relaunched = *relaunch;
  // several processes: join the job before anything else (rank 0 publishes the coordinator)
  auto cluster = resolve_cluster_env(args->cluster, process_environment());
  if (!cluster) {
    print_error(program.name, cluster.error().message);
    return kExitUsage;
  }
  std::string secret;
  if (cluster->multi_process()) {
    auto loaded = load_job_secret(*cluster, process_environment());
    if (!loaded) {
      print_error(program.name, loaded.error().message);
      return kExitError;
    }
    secret = std::move(*loaded);
  }
  // under actorpipe-launch --max-restarts: this process's part of a failed run rejoins the job
  auto rejoins = rejoin_limit(process_environment());
  if (!rejoins) {
    print_error(program.name, rejoins.error().message);
    return kExitUsage;
  }
  const int relaunched_at = options.relaunched ? options.relaunched->restart : 0;
  int restart = relaunched_at;
  // the last failure of this process's own (no rank lost), without its numbers, the step it
  // came at and the restart that followed it: the same failure again, no step further on, would
  // come again at every restart (a config that cannot run on this job, say)
  std::string repeated;
  long repeated_step = -1;
  int repeated_restart = 0;
  // under actorpipe-launch --max-restarts: the failure this rank's process before this one
  // left (a relaunch starts with it as the failure before its restart)
  const char* record_env = std::getenv(cluster_vars::failure_file);
  const std::string record_path = record_env != nullptr ? record_env : "";
  if (!record_path.empty() && options.relaunched) {
    auto before = read_failure_record(record_path);
    if (!before) {
      fmt::print(stderr, "{}: warning: {}; a repeated failure is not recognised\n", program.name,
                 before.error().message);
    } else if (before->has_value()) {
      repeated = failure_without_numbers((*before)->error);
      repeated_step = (*before)->step;
      repeated_restart = (*before)->restart;
    }
  }
  // the same failure of its own again, no step further on
  auto repeats = [&](const Attempt& a) {
    return !a.peer_lost && !repeated.empty() && failure_without_numbers(a.error) == repeated &&
           a.step <= repeated_step;
  };
  // says why this rank is not started or rejoined again, and tells the launcher so
  auto no_restart = [&](const char* what, const Attempt& a) {
    print_error(
        program.name,
        fmt::format("rank {}: {}: the same failure as before restart {}, {} (a restart "
                    "cannot help; exit status {} tells actorpipe-launch not to relaunch "
                    "this rank)",
                    cluster->rank, what, repeated_restart,
                    a.step < 0 ? std::string("before any step") : fmt::format("at step {}", a.step),
                    kExitNoRestart));
    return kExitNoRestart;
  };
  for (bool rejoining = options.relaunched.has_value();; rejoining = true) {
    Config c = *config;
    if (options.relaunched && !c.checkpoint.dir.empty() &&
        !checkpoints_in(c.checkpoint.dir).empty()) {
      c.checkpoint.resume = c.checkpoint.dir;
      c.checkpoint.overwrite = false;
    }
    const Attempt a = train_in_job(program, c, options, *cluster, secret, rejoining,
                                   restart > relaunched_at, *rejoins > 0);
    if (!a.may_rejoin || !cluster->multi_process() || restart >= *rejoins) {
      // this process ends; under --max-restarts the launcher may start another in its place
      if (a.code != kExitError || a.error.empty() || a.peer_lost || a.on_signal ||
          record_path.empty())
        return a.code;
      if (repeats(a)) return no_restart("not starting again", a);
      if (Status w = write_failure_record(record_path, {a.error, a.step, restart + 1}); !w)
        fmt::print(stderr, "{}: warning: {}; a repeated failure will not be recognised\n",
                   program.name, w.error().message);
      return a.code;
    }
    if (!a.peer_lost) {
      if (repeats(a)) return no_restart("not rejoining the job again", a);
      repeated = failure_without_numbers(a.error);
      repeated_step = a.step;
      repeated_restart = restart + 1;
    }
    ++restart;
    fmt::print(stderr,
               "{}: rank {} rejoins the job (restart {} of {}, actorpipe-launch --max-restarts) "
               "after: {}\n",
               program.name, cluster->rank, restart, *rejoins, a.error);
    std::fflush(stderr);
    options.relaunched = TrainerRestart{};
    options.relaunched->restart = restart;
    options.relaunched->max_restarts = *rejoins;
    options.relaunched->error = a.error;
  }
}

}  // namespace actorpipe
