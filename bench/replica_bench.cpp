// `actorpipe-bench replicas`: two processes as w 2 × d 1 and as w 1 × d 2 beside one process,
// with the width × depth planner's predictions and choice, and the all-reduce's hidden share.
#include "bench/replica_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <utility>

#include "actors/process_group.hpp"
#include "bench/bench_report.hpp"
#include "bench/bench_shapes.hpp"
#include "bench/machine.hpp"
#include "bench/pipeline_timing.hpp"
#include "bench/rank_job.hpp"
#include "bench/step_timing.hpp"
#include "bench/subprocess.hpp"
#include "engine/planner/width_depth.hpp"
#include "engine/profiler/auto_partition.hpp"
#include "transport/gloo_bandwidth.hpp"

namespace actorpipe::bench {

namespace {

using json = nlohmann::ordered_json;

// Targets: the planner's choice within 5% of the best measured configuration; the backward
// hides at least half of the replicas' all-reduce time.
constexpr double kChoiceTarget = 0.95;
constexpr double kHiddenTarget = 0.5;

// Inside a child: one configuration, in this process or as a rank of a job.
int run_child(const ReplicaBenchOptions& o) {
  const BenchShape shape = find_bench_shape(o.shape).value();
  PipelineRunSpec spec;
  spec.model = shape.model;
  spec.B = shape.B;
  spec.T = shape.T;
  spec.mode = o.mode;
  spec.stages = o.stages;
  spec.microbatches = o.microbatches;
  spec.partition = o.partition;
  spec.replicas = o.replicas;
  spec.record_spans = o.replicas > 1;
  spec.warmup = o.warmup;
  spec.reps = o.reps;
  std::unique_ptr<ProcessGroup> group;
  if (o.rank_child == "ranks") {
    auto joined = join_rank_job();
    if (!joined) {
      fmt::print(stderr, "actorpipe-bench replicas: {}\n", joined.error().message);
      return 1;
    }
    group = std::move(*joined);
    spec.group = group.get();
  }
  auto r = measure_pipeline(spec);
  if (!r) {
    fmt::print(stderr, "actorpipe-bench replicas: w {} × d {}: {}\n", o.replicas, o.stages,
               r.error().message);
    return 1;
  }
  json j;
  j["name"] = group && group->rank() != 0 ? "replica_rank" : "replica_run";
  j["tokens_per_s"] = r->tokens_per_s;
  j["step_seconds_all"] = r->step_seconds_all;
  j["first_loss"] = r->first_loss;
  j["allreduce_seconds"] = r->allreduce_seconds;
  j["allreduce_hidden_seconds"] = r->allreduce_hidden_seconds;
  fmt::print("{}\n", j.dump());
  std::fflush(stdout);
  if (group) {
    if (Status s = group->leave(); !s) {
      fmt::print(stderr, "actorpipe-bench replicas: {}\n", s.error().message);
      return 1;
    }
  }
  return 0;
}

// One configuration the parent measures.
struct Config2 {
  std::string label;
  bool ranks = false;  // two processes (else one)
  int replicas = 1;
  int stages = 2;
  std::vector<int> partition;
  double predicted_tokens = 0.0;  // the planner's, 0 when it has none (one process)
  std::vector<double> tokens;     // measured, per run
  std::vector<double> hidden;     // per run: hidden / all-reduce time, both ranks together
  std::vector<double> first_loss;
  Interference worst;
};

std::vector<std::string> child_args(const ReplicaBenchOptions& o, const Config2& c) {
  std::vector<std::string> a = {"replicas",
                                "--rank-child",
                                c.ranks ? "ranks" : "local",
                                "--mode",
                                std::string(to_string(o.mode)),
                                "--shape",
                                o.shape,
                                "--microbatches",
                                std::to_string(o.microbatches),
                                "--reps",
                                std::to_string(o.reps),
                                "--warmup",
                                std::to_string(o.warmup),
                                "--replicas",
                                std::to_string(c.replicas),
                                "--stages",
                                std::to_string(c.stages)};
  if (!c.partition.empty())
    a.insert(a.end(), {"--partition", fmt::format("{}", fmt::join(c.partition, ","))});
  return a;
}

// Runs `c` once and adds its figures; the error, or "".
std::string run_once(const ReplicaBenchOptions& o, Config2& c) {
  const std::vector<std::pair<std::string, std::string>> env = {{"OPENBLAS_NUM_THREADS", "1"}};
  const CpuSnapshot before = cpu_snapshot();
  std::vector<std::vector<std::string>> out;
  if (c.ranks) {
    auto job = run_rank_job(child_args(o, c), 2, env);
    if (!job) return job.error().message;
    if (!job->failure.empty()) return job->failure;
    out = job->out;
  } else {
    std::vector<std::string> argv = {self_executable()};
    const auto a = child_args(o, c);
    argv.insert(argv.end(), a.begin(), a.end());
    auto proc = run_process(argv, env);
    if (!proc) return proc.error().message;
    if (proc->exit_code != 0) return fmt::format("exited with status {}", proc->exit_code);
    out.push_back(split_lines(proc->out));
  }
  const Interference i = interference(before, cpu_snapshot());
  if (!c.worst.known || i.other > c.worst.other) c.worst = i;
  auto main = find_json_line(out[0], "replica_run", c.ranks ? "rank 0" : "the child");
  if (!main) return main.error().message;
  const json j = json::parse(*main);
  c.tokens.push_back(j["tokens_per_s"].get<double>());
  c.first_loss.push_back(j["first_loss"].get<double>());
  double all = j["allreduce_seconds"].get<double>();
  double hidden = j["allreduce_hidden_seconds"].get<double>();
  if (c.ranks) {
    auto other = find_json_line(out[1], "replica_rank", "rank 1");
    if (!other) return other.error().message;
    const json k = json::parse(*other);
    all += k["allreduce_seconds"].get<double>();
    hidden += k["allreduce_hidden_seconds"].get<double>();
  }
  if (c.replicas > 1) c.hidden.push_back(all > 0 ? hidden / all : 0.0);
  return "";
}

}  // namespace

std::string replica_usage() {
  return R"(usage: actorpipe-bench replicas [options]

A GPT on two processes (two ranks of one job on 127.0.0.1) as two replicas of a one-stage
pipeline (w 2 x d 1: gradients summed with Gloo) and as one pipeline of two stages (w 1 x d 2),
beside that pipeline in one process; every stage on 1 thread, each run in fresh processes,
configurations alternating. Beside each: the width x depth planner's prediction (measured layer
profile, the all-reduce measured here unless given), then the planner's choice against the
best measured, and the share of the all-reduce time that ran during a backward (the trace's
allreduce spans against its B spans).
Targets: the planner's choice >= 95% of the best measured tokens/s; >= 50% of the all-reduce
hidden behind the backward.

  --shape NAME               GPT shape: tiny, small, gpt2 (default: small)
  --mode MODE                gpipe, 1f1b or 2bw (default: 1f1b)
  --microbatches M           microbatches per step, all replicas together (default: 8)
  --reps N                   timed steps per run (default: 3)
  --warmup N                 untimed steps first, at least 1 (default: 1)
  --repeats N                runs of each configuration (default: 2)
  --profile-reps N           calls timed per layer for the planner's profile (default: 3)
  --allreduce-bandwidth B    bytes per second a member sends (default: measured here)
  --json                     one JSON object per line instead of tables
)";
}

Expected<ReplicaBenchOptions> parse_replica_options(std::span<const std::string> args) {
  ReplicaBenchOptions o;
  const Status parsed = parse_options(args, o, [&](size_t& i) -> Status {
    const std::string& a = args[i];
    if (a == "--shape") {
      auto v = shape_option(args, i);
      if (!v) return v.error();
      o.shape = *v;
    } else if (a == "--mode") {
      auto mode = mode_option(args, i);
      if (!mode) return mode.error();
      if (*mode == Mode::pipedream || *mode == Mode::xpipe)
        return make_error("--mode {}: runs no replicas (allowed: gpipe, 1f1b, 2bw)",
                          to_string(*mode));
      o.mode = *mode;
    } else if (a == "--partition") {
      auto v = int_list_option(args, i, 1, 100000);
      if (!v) return v.error();
      o.partition = *v;
    } else if (a == "--microbatches" || a == "--reps" || a == "--warmup" || a == "--repeats" ||
               a == "--profile-reps" || a == "--replicas" || a == "--stages") {
      auto n = int_option(args, i, 1, 100000);
      if (!n) return n.error();
      (a == "--microbatches"   ? o.microbatches
       : a == "--reps"         ? o.reps
       : a == "--warmup"       ? o.warmup
       : a == "--repeats"      ? o.repeats
       : a == "--profile-reps" ? o.profile_reps
       : a == "--replicas"     ? o.replicas
                               : o.stages) = *n;
    } else if (a == "--allreduce-bandwidth") {
      auto v = option_value(args, i);
      if (!v) return v.error();
      char* end = nullptr;
      errno = 0;
      const double x = std::strtod(v->c_str(), &end);
      if (v->empty() || *end != '\0' || errno != 0 || !(x > 0) || !std::isfinite(x))
        return make_error("--allreduce-bandwidth: '{}' is not allowed: expected bytes/s > 0", *v);
      o.allreduce_bandwidth = x;
    } else if (a == "--rank-child") {
      auto v = option_value(args, i);
      if (!v) return v.error();
      if (*v != "local" && *v != "ranks")
        return make_error("--rank-child: '{}' is not allowed: expected local or ranks", *v);
      o.rank_child = *v;
    } else {
      return make_error("unknown option '{}' (see actorpipe-bench replicas --help)", a);
    }
    return {};
  });
  if (!parsed) return parsed.error();
  if (o.microbatches % 2 != 0)
    return make_error("--microbatches {}: two replicas need an even number", o.microbatches);
  if (o.mode == Mode::twobw && o.microbatches < 2)
    return make_error("--microbatches {}: 2bw needs at least 2 on two stages", o.microbatches);
  return o;
}

int run_replica_bench(std::span<const std::string> args) {
  auto parsed = parse_replica_options(args);
  if (!parsed) {
    fmt::print(stderr, "actorpipe-bench replicas: {}\n", parsed.error().message);
    return 2;
  }
  const ReplicaBenchOptions& o = *parsed;
  if (o.help) {
    fmt::print("{}", replica_usage());
    return 0;
  }
  if (!o.rank_child.empty()) return run_child(o);
  auto out = [&](const std::string& s) {
    fmt::print("{}", s);
    std::fflush(stdout);
  };
  const Interference start = sample_interference(std::chrono::milliseconds(500));
  const std::string machine = describe_machine();
  warn_if_busy("actorpipe-bench", start);
  const BenchShape shape = find_bench_shape(o.shape).value();

  // the planner: the measured layer profile, the all-reduce's cost, every split of 2 processes
  Config c;
  c.model = shape.model;
  c.pipeline.mode = std::string(to_string(o.mode));
  c.pipeline.stages = 2;
  c.pipeline.microbatches = o.microbatches;
  c.pipeline.microbatch_size = shape.B;
  c.pipeline.seq_len = shape.T;
  AutoPartitionOptions ao;
  ao.reps = o.profile_reps;
  auto profiled = plan_auto_partition(c, ao);
  if (!profiled) {
    fmt::print(stderr, "actorpipe-bench replicas: profiling: {}\n", profiled.error().message);
    return 1;
  }
  PlannerOptions base = profiled->planner;
  base.microbatches = o.microbatches;
  base.stage_speed.clear();
  std::string cost_note;
  if (o.allreduce_bandwidth > 0) {
    base.allreduce_bandwidth = o.allreduce_bandwidth;
    cost_note = fmt::format("{:.1f} MB/s per member (given)", o.allreduce_bandwidth / 1e6);
  } else {
    std::int64_t grad = 0;
    for (const LayerCosts& l : profiled->costs) grad += l.gradient_bytes;
    auto cost = measure_all_reduce_cost(std::max<std::int64_t>(1, grad / 2 / 4), 5);
    if (!cost) {
      fmt::print(stderr, "actorpipe-bench replicas: {}\n", cost.error().message);
      return 1;
    }
    base.allreduce_bandwidth = cost->bandwidth;
    base.allreduce_latency = cost->latency;
    cost_note = fmt::format("measured here: {:.1f} MB/s per member, latency {:.3f} ms",
                            cost->bandwidth / 1e6, 1e3 * cost->latency);
  }
  auto wd = plan_width_depth(profiled->costs, base, 2);
  if (!wd) {
    fmt::print(stderr, "actorpipe-bench replicas: {}\n", wd.error().message);
    return 1;
  }
  const double step_tokens = static_cast<double>(o.microbatches) * shape.B * shape.T;
  const WidthDepthPlan* deep = nullptr;
  const WidthDepthPlan* wide = nullptr;
  for (const WidthDepthPlan& p : wd->ranked) (p.replicas == 1 ? deep : wide) = &p;
  if (deep == nullptr || wide == nullptr) {
    fmt::print(stderr, "actorpipe-bench replicas: the planner left a split out: {}\n",
               fmt::join(wd->skipped, "; "));
    return 1;
  }
  const WidthDepthPlan& choice = wd->ranked[0];

  // the peer, then the planner's two splits of two processes
  auto config = [](std::string label, bool ranks, int replicas, int stages,
                   std::vector<int> partition, double predicted) {
    Config2 run;
    run.label = std::move(label);
    run.ranks = ranks;
    run.replicas = replicas;
    run.stages = stages;
    run.partition = std::move(partition);
    run.predicted_tokens = predicted;
    return run;
  };
  std::vector<Config2> configs;
  configs.push_back(config("1 process, w 1 × d 2", false, 1, 2, deep->plan.layers_per_stage, 0.0));
  configs.push_back(config("2 processes, w 1 × d 2", true, 1, 2, deep->plan.layers_per_stage,
                           step_tokens / deep->predicted_step_seconds));
  configs.push_back(
      config("2 processes, w 2 × d 1", true, 2, 1, {}, step_tokens / wide->predicted_step_seconds));
  if (!o.json)
    out(fmt::format(
        "actorpipe-bench replicas: GPT {} ({}), {} mode, m = {} per step, 1 thread per stage\n"
        "machine: {}; other processes at the start: {} cores\n"
        "planner: layer profile {}; all-reduce {}\n"
        "\n{} timed steps after {} untimed per run, {} runs of each configuration alternating, "
        "medians; tok/s per run in brackets\n{:<24} {:>10} {:>26} {:>9} {:>18}  {}\n",
        shape.name, shape.describe(), to_string(o.mode), o.microbatches, machine,
        interference_cell(start),
        profiled->from_cache ? "from the cache" : fmt::format("measured ({} reps)", o.profile_reps),
        cost_note, o.reps, o.warmup, o.repeats, "configuration", "predicted", "measured tok/s",
        "vs 1 proc", "all-reduce hidden", "other"));
  int failures = 0, disturbed = 0;
  std::string error;
  for (int k = 0; k < o.repeats && error.empty(); ++k) {
    for (Config2& cfg : configs) {
      if (std::string e = run_once(o, cfg); !e.empty()) {
        error = cfg.label + ": " + e;
        break;
      }
      disturbed += distorted(cfg.worst) ? 1 : 0;
    }
  }
  if (!error.empty()) {
    json j;
    j["name"] = "replicas";
    j["ok"] = false;
    j["error"] = error;
    out(o.json ? j.dump() + "\n" : fmt::format("FAILED: {}\n", error));
    return 1;
  }
  const double local = median(configs[0].tokens);
  double best = 0.0;
  for (const Config2& cfg : configs) best = std::max(best, median(cfg.tokens));
  for (const Config2& cfg : configs) {
    const double t = median(cfg.tokens);
    const std::string hidden =
        cfg.hidden.empty() ? "-" : fmt::format("{:.0f}%", 100.0 * median(cfg.hidden));
    json j;
    j["name"] = "replicas_config";
    j["ok"] = true;
    j["machine"] = machine;
    j["shape"] = shape.name;
    j["mode"] = std::string(to_string(o.mode));
    j["configuration"] = cfg.label;
    j["replicas"] = cfg.replicas;
    j["stages"] = cfg.stages;
    j["partition"] = cfg.partition;
    j["predicted_tokens_per_s"] = cfg.predicted_tokens;
    j["tokens_per_s"] = t;
    j["runs"] = cfg.tokens;
    j["ratio_one_process"] = t / local;
    if (!cfg.hidden.empty()) j["allreduce_hidden"] = median(cfg.hidden);
    add_interference(j, cfg.worst);
    out(o.json ? j.dump() + "\n"
               : fmt::format("{:<24} {:>10} {:>8.0f} [{:>15}] {:>8.1f}% {:>18}  {}\n", cfg.label,
                             cfg.predicted_tokens > 0 ? fmt::format("{:.0f}", cfg.predicted_tokens)
                                                      : std::string("-"),
                             t, cells(cfg.tokens, "{:.0f}"), 100.0 * t / local, hidden,
                             interference_cell(cfg.worst)));
  }
  // the planner's choice against the best measured; the hidden share of the replicas'
  const Config2& chosen = choice.replicas == 1 ? configs[1] : configs[2];
  const double ratio = median(chosen.tokens) / best;
  const double hidden = median(configs[2].hidden);
  bool same_loss = true;
  for (const Config2& cfg : configs)
    for (double l : cfg.first_loss)
      same_loss = same_loss && std::abs(l - configs[0].first_loss[0]) < 1e-3;
  json j;
  j["name"] = "replicas_summary";
  j["ok"] = true;
  j["choice"] = fmt::format("w {} × d {}", choice.replicas, choice.stages);
  j["choice_ratio_of_best"] = ratio;
  j["choice_meets_target"] = ratio >= kChoiceTarget;
  j["allreduce_hidden"] = hidden;
  j["hidden_meets_target"] = hidden >= kHiddenTarget;
  j["first_losses_agree"] = same_loss;
  out(o.json ? j.dump() + "\n"
             : fmt::format(
                   "\nplanner's choice: w {} × d {} (predicted {:.0f} tok/s): measured {:.0f} "
                   "tok/s, {:.1f}% of the best measured: {} (target >= 95%)\n"
                   "all-reduce of w 2 × d 1 during a backward: {:.0f}%: {} (target >= 50%)\n"
                   "first losses of every run agree within 1e-3: {}\n\n{}\n",
                   choice.replicas, choice.stages, step_tokens / choice.predicted_step_seconds,
                   median(chosen.tokens), 100.0 * ratio, ratio >= kChoiceTarget ? "met" : "MISSED",
                   100.0 * hidden, hidden >= kHiddenTarget ? "met" : "MISSED",
                   same_loss ? "yes" : "NO", interference_summary(disturbed)));
  if (!same_loss) ++failures;
  return failures == 0 ? 0 : 1;
}

}  // namespace actorpipe::bench
