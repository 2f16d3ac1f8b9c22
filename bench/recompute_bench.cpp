// `actorpipe-bench recompute`: a GPT pipeline trained with pipeline.recompute = none, auto
// (under a memory limit that binds) and all, each run in a fresh process that reports its peak
// RSS, the engine's stash bytes and its step times; rounds alternate the configurations.
#include "bench/recompute_bench.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "actors/actor_engine.hpp"
#include "bench/bench_shapes.hpp"
#include "bench/machine.hpp"
#include "bench/pipeline_timing.hpp"
#include "bench/step_timing.hpp"
#include "bench/subprocess.hpp"
#include "engine/config/config.hpp"
#include "engine/execution/stage_worker.hpp"
#include "engine/model/partition.hpp"
#include "engine/profiler/auto_partition.hpp"

namespace actorpipe::bench {

namespace {

// The config every configuration trains: the shape's GPT, synthetic data, default AdamW.
Config base_config(const RecomputeBenchOptions& o) {
  const BenchShape shape = find_bench_shape(o.shape).value();
  Config c;
  c.model = shape.model;
  c.pipeline.mode = std::string(to_string(o.mode));
  c.pipeline.stages = o.stages;
  c.pipeline.microbatches = o.microbatches;
  c.pipeline.microbatch_size = shape.B;
  c.pipeline.seq_len = shape.T;
  c.pipeline.threads_per_stage = o.threads;
  c.pipeline.precision = o.precision;
  c.pipeline.stash_precision = o.stash_precision;
  return c;
}

// "none", "all" or "1,2,3" as a RecomputeSpec.
Expected<RecomputeSpec> parse_layers(const std::string& text) {
  if (text == "none") return RecomputeSpec{};
  if (text == "all") return RecomputeSpec{RecomputeSpec::Kind::all, {}};
  auto layers = parse_int_list("--child", text, 0, 100000);
  if (!layers) return layers.error();
  return RecomputeSpec{RecomputeSpec::Kind::layers, *layers};
}

std::string layers_text(const std::vector<int>& layers) {
  return layers.empty() ? "none" : fmt::format("{}", fmt::join(layers, ","));
}

// One configuration in this process: one JSON line.
int run_child(const RecomputeBenchOptions& o) {
  Config c = base_config(o);
  auto spec = parse_layers(o.child);
  if (!spec) {
    fmt::print(stderr, "actorpipe-bench recompute: {}\n", spec.error().message);
    return 2;
  }
  c.pipeline.recompute = *spec;
  ActorEngineOptions eo;
  eo.stall_timeout_seconds = 900.0;  // a busy machine slows a step, it does not stall it
  auto engine = ActorEngine::create(c, eo);
  if (!engine) {
    fmt::print(stderr, "actorpipe-bench recompute: {}\n", engine.error().message);
    return 1;
  }
  const int group = o.mode == Mode::pipedream ? o.microbatches : 1;
  const int steps = (o.warmup + o.reps) * group;
  auto source = DataLoader::open(c.data, c.model.arch, c.model.vocab_size,
                                 c.pipeline.microbatch_size, c.pipeline.seq_len);
  if (!source) {
    fmt::print(stderr, "actorpipe-bench recompute: {}\n", source.error().message);
    return 1;
  }
  ReplayLoader data(**source, std::min((o.warmup + o.reps) * o.microbatches, 32));
  std::vector<double> seconds;
  ActorCallbacks cb;
  cb.on_step = [&](const StepProgress& p) { seconds.push_back(p.seconds); };
  auto result = (*engine)->run(steps, data, cb);
  if (!result) {
    fmt::print(stderr, "actorpipe-bench recompute: {}\n", result.error().message);
    return 1;
  }
  const std::vector<double> periods = step_periods(seconds, group, o.warmup);
  size_t stash = 0, scratch = 0, weights = 0;
  std::vector<int> recomputed;
  for (int r = 0; r < (*engine)->stages(); ++r) {
    const StageWorker& w = (*engine)->worker(r);
    weights += w.weight_bytes();
    stash += w.stash_bytes();
    scratch += w.recompute_scratch_bytes();
    for (int i = 0; i < w.num_layers(); ++i)
      if (w.recomputes(i)) recomputed.push_back(w.first_layer() + i);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  nlohmann::ordered_json j;
  j["name"] = "recompute_child";
  j["layers"] = recomputed;
  j["step_seconds"] = periods;
  j["stash_bytes"] = stash;
  j["scratch_bytes"] = scratch;
  j["weight_bytes"] = weights;
  j["max_rss_bytes"] = static_cast<long long>(ru.ru_maxrss) * 1024;
  j["losses"] = result->losses;
  fmt::print("{}\n", j.dump());
  return 0;
}

}  // namespace

Expected<MeasuredRun> measure_in_child(const RecomputeBenchOptions& o, const std::string& layers) {
  std::vector<std::string> argv = {self_executable(),
                                   "recompute",
                                   "--child",
                                   layers,
                                   "--shape",
                                   o.shape,
                                   "--mode",
                                   std::string(to_string(o.mode)),
                                   "--stages",
                                   std::to_string(o.stages),
                                   "--microbatches",
                                   std::to_string(o.microbatches),
                                   "--threads",
                                   std::to_string(o.threads),
                                   "--reps",
                                   std::to_string(o.reps),
                                   "--warmup",
                                   std::to_string(o.warmup),
                                   "--precision",
                                   o.precision,
                                   "--stash-precision",
                                   o.stash_precision};
  auto proc = run_process(argv, {{"OPENBLAS_NUM_THREADS", "1"}});
  if (!proc) return proc.error();
  if (proc->exit_code != 0)
    return make_error("recompute {}: the measuring process exited with status {}", layers,
                      proc->exit_code);
  auto j = nlohmann::json::parse(proc->out, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error("recompute {}: unreadable measurement '{}'", layers,
                      proc->out.substr(0, 200));
  MeasuredRun c;
  c.layers = j.at("layers").get<std::vector<int>>();
  c.step_seconds = j.at("step_seconds").get<std::vector<double>>();
  c.stash_bytes = j.at("stash_bytes").get<double>();
  c.scratch_bytes = j.at("scratch_bytes").get<double>();
  c.weight_bytes = j.at("weight_bytes").get<double>();
  c.max_rss_bytes = j.at("max_rss_bytes").get<double>();
  c.losses = j.at("losses").get<std::vector<double>>();
  return c;
}

namespace {

std::string relative(double x, double peer) {
  return peer > 0 ? fmt::format("{:+.1f}%", 100.0 * (x / peer - 1.0)) : std::string("-");
}

}  // namespace

Expected<RecomputeBenchOptions> parse_recompute_options(std::span<const std::string> args,
                                                        RecomputeBenchOptions defaults) {
  RecomputeBenchOptions o = std::move(defaults);
  const Status parsed = parse_options(args, o, [&](size_t& i) -> Status {
    const std::string& a = args[i];
    if (a == "--shape") {
      auto v = shape_option(args, i);
      if (!v) return v.error();
      o.shape = *v;
    } else if (a == "--mode") {
      auto mode = mode_option(args, i);
      if (!mode) return mode.error();
      o.mode = *mode;
    } else if (a == "--stages" || a == "--microbatches" || a == "--threads" || a == "--reps" ||
               a == "--warmup" || a == "--rounds" || a == "--profile-reps") {
      auto n = int_option(args, i, 1, 100000);
      if (!n) return n.error();
      (a == "--stages"         ? o.stages
       : a == "--microbatches" ? o.microbatches
       : a == "--threads"      ? o.threads
       : a == "--reps"         ? o.reps
       : a == "--warmup"       ? o.warmup
       : a == "--rounds"       ? o.rounds
                               : o.profile_reps) = *n;
    } else if (a == "--limit-mb") {
      auto n = int_option(args, i, 0, 100000000);
      if (!n) return n.error();
      o.limit_mb = *n;
    } else if (a == "--precision" || a == "--stash-precision") {
      auto v = option_value(args, i);
      if (!v) return v.error();
      if (*v != "fp32" && *v != "bf16") return make_error("{} {}: expected fp32 or bf16", a, *v);
      (a == "--precision" ? o.precision : o.stash_precision) = *v;
    } else if (a == "--cache-dir") {
      auto v = option_value(args, i);
      if (!v) return v.error();
      if (v->empty()) return make_error("--cache-dir: needs a directory");
      o.cache_dir = *v;
    } else if (a == "--child") {
      auto v = option_value(args, i);
      if (!v) return v.error();
      if (auto s = parse_layers(*v); !s) return s.error();
      o.child = *v;
    } else {
      return make_error("unknown option '{}' (see actorpipe-bench recompute --help)", a);
    }
    return {};
  });
  if (!parsed) return parsed.error();
  // the config's own checks (stages against layers, 2bw's m >= d, ...), naming the key
  if (auto st = validate(base_config(o)); !st) return st.error();
  return o;
}

std::string recompute_usage() {
  return R"(usage: actorpipe-bench recompute [--shape NAME] [--mode MODE] [--stages D]
                                 [--microbatches M] [--threads N] [--reps N] [--warmup N]
                                 [--rounds N] [--limit-mb N] [--profile-reps N]
                                 [--precision P] [--stash-precision P] [--cache-dir DIR]
                                 [--json]

Trains a GPT pipeline (the actor engine, even partition) with pipeline.recompute = none, auto and
all, each run in a fresh process, and prints per configuration its peak memory (the process's
peak RSS, getrusage) and the activation stash the stages allocated (with the recompute scratch),
its median step time, and each against none (the peer). Rounds alternate the configurations
(round k starts with the k-th) and the figures are medians over the rounds. The losses of every
run must be bitwise equal: recompute changes no bit.
"auto" is the planner's choice under pipeline.memory_limit_mb for the even partition, from the
layer profile (measured once and cached, like actorpipe-plan).
  --shape NAME        tiny | small | gpt2 (default small)
  --mode MODE         gpipe | 1f1b | 2bw | pipedream | xpipe (default gpipe)
  --stages D          pipeline stages (default 2)
  --microbatches M    microbatches per step (default 4)
  --threads N         threads per stage (default 1)
  --reps N            timed steps per run (default 3), after --warmup N untimed (default 1)
  --rounds N          runs of each configuration (default 3)
  --limit-mb N        pipeline.memory_limit_mb for auto (default: 3/4 of the largest stage the
                      planner predicts without recompute, whole MiB)
  --profile-reps N    calls timed per layer for the planner's profile (default 3)
  --precision P       pipeline.precision: fp32 | bf16 (default fp32)
  --stash-precision P pipeline.stash_precision: fp32 | bf16 (default fp32)
  --cache-dir DIR     the profile cache (default $ACTORPIPE_CACHE_DIR, ~/.cache/actorpipe)
  --json              JSON lines: recompute_setup, one recompute_config per configuration,
                      recompute_end
  --help              this text
)";
}

int run_recompute_bench(std::span<const std::string> args) {
  auto parsed = parse_recompute_options(args);
  if (!parsed) {
    fmt::print(stderr, "actorpipe-bench recompute: {}\n", parsed.error().message);
    return 2;
  }
  RecomputeBenchOptions o = *parsed;
  if (o.help) {
    fmt::print("{}", recompute_usage());
    return 0;
  }
  if (!o.child.empty()) return run_child(o);

  const Interference start = sample_interference(std::chrono::milliseconds(500));
  const std::string machine = describe_machine();
  warn_if_busy("actorpipe-bench", start);
  auto out = [&](const std::string& s) {
    fmt::print("{}", s);
    std::fflush(stdout);
  };

  // "auto": the planner's layers for the even partition under a limit that binds
  Config c = base_config(o);
  c.pipeline.recompute.kind = RecomputeSpec::Kind::automatic;
  AutoPartitionOptions ao;
  ao.cache_dir = o.cache_dir;
  ao.reps = o.profile_reps;
  auto free = plan_auto_partition(c, ao);
  if (!free) {
    fmt::print(stderr, "actorpipe-bench recompute: {}\n", free.error().message);
    return 1;
  }
  std::int64_t largest = 0;
  for (const StagePlan& st : free->result.plan.stages)
    largest = std::max(largest, st.bytes.total());
  const int limit =
      o.limit_mb > 0 ? o.limit_mb : std::max(1, static_cast<int>((largest - largest / 4) >> 20));
  c.pipeline.memory_limit_mb = limit;
  auto planned = plan_auto_partition(c, ao);
  if (!planned) {
    fmt::print(stderr, "actorpipe-bench recompute: auto under {} MiB: {}\n", limit,
               planned.error().message);
    return 1;
  }
  const std::vector<int> auto_layers = recomputed_layers(planned->recompute);
  const BenchShape shape = find_bench_shape(o.shape).value();
  if (o.json) {
    nlohmann::ordered_json j;
    j["name"] = "recompute_setup";
    j["shape"] = shape.name;
    j["mode"] = to_string(o.mode);
    j["stages"] = o.stages;
    j["microbatches"] = o.microbatches;
    j["threads"] = o.threads;
    j["limit_mb"] = limit;
    j["planned_largest_stage_bytes"] = largest;
    j["auto_layers"] = auto_layers;
    j["machine"] = machine;
    out(j.dump() + "\n");
  } else {
    out(fmt::format(
        "actorpipe-bench recompute: GPT {} ({}), {}, {} stages x {} thread{}, m = {}, even "
        "partition\n"
        "machine: {}; other processes at the start: {} cores\n"
        "auto: pipeline.memory_limit_mb = {} (the planner predicts {:.1f} MiB for the largest "
        "stage without recompute) -> recompute {}\n"
        "each configuration in a fresh process, {} round{} alternating, {} timed step{} after {} "
        "warm-up; medians\n\n",
        shape.name, shape.describe(), to_string(o.mode), o.stages, o.threads,
        o.threads == 1 ? "" : "s", o.microbatches, machine, interference_cell(start), limit,
        mib(static_cast<double>(largest)),
        auto_layers.empty() ? std::string("none (the limit does not bind)")
                            : fmt::format("{{{}}}", fmt::join(auto_layers, ", ")),
        o.rounds, o.rounds == 1 ? "" : "s", o.reps, o.reps == 1 ? "" : "s", o.warmup));
  }

  struct Config_ {
    std::string name, arg;
    std::vector<MeasuredRun> runs;
  };
  std::vector<Config_> configs = {
      {"none", "none", {}}, {"auto", layers_text(auto_layers), {}}, {"all", "all", {}}};
  int failures = 0, disturbed = 0;
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t k = 0; k < configs.size(); ++k) {
      Config_& cfg = configs[(k + static_cast<size_t>(round)) % configs.size()];
      const CpuSnapshot before = cpu_snapshot();
      auto child = measure_in_child(o, cfg.arg);
      if (!child) {
        fmt::print(stderr, "actorpipe-bench recompute: {}\n", child.error().message);
        ++failures;
        continue;
      }
      if (distorted(interference(before, cpu_snapshot()))) ++disturbed;
      cfg.runs.push_back(std::move(*child));
    }
  }
  // every run trains the same bits
  bool equal = true;
  const std::vector<double>* first = nullptr;
  for (const Config_& cfg : configs) {
    for (const MeasuredRun& r : cfg.runs) {
      if (first == nullptr) first = &r.losses;
      equal = equal && r.losses == *first;
    }
  }
  struct Row {
    double step = 0, rss = 0, stash = 0;
  };
  std::vector<Row> rows;
  for (const Config_& cfg : configs) {
    Row row;
    std::vector<double> steps, rss;
    for (const MeasuredRun& r : cfg.runs) {
      steps.push_back(median(r.step_seconds));
      rss.push_back(r.max_rss_bytes);
      row.stash = r.stash_bytes + r.scratch_bytes;
    }
    if (!steps.empty()) {
      row.step = median(steps);
      row.rss = median(rss);
    }
    rows.push_back(row);
  }
  if (!o.json) {
    out(fmt::format("{:<6} {:<26} {:>9} {:>8} {:>13} {:>9} {:>10} {:>9}\n", "", "layers", "step ms",
                    "vs none", "peak RSS MiB", "vs none", "stash MiB", "vs none"));
  }
  for (size_t k = 0; k < configs.size(); ++k) {
    const Config_& cfg = configs[k];
    const Row& r = rows[k];
    const std::vector<int> layers = cfg.runs.empty() ? std::vector<int>{} : cfg.runs[0].layers;
    if (o.json) {
      nlohmann::ordered_json j;
      j["name"] = "recompute_config";
      j["recompute"] = cfg.name;
      j["layers"] = layers;
      j["runs"] = cfg.runs.size();
      j["step_seconds"] = r.step;
      j["max_rss_bytes"] = r.rss;
      j["stash_bytes"] = r.stash;
      j["step_vs_none"] = rows[0].step > 0 ? r.step / rows[0].step : 0.0;
      j["rss_vs_none"] = rows[0].rss > 0 ? r.rss / rows[0].rss : 0.0;
      j["stash_vs_none"] = rows[0].stash > 0 ? r.stash / rows[0].stash : 0.0;
      out(j.dump() + "\n");
    } else {
      const std::string shown =
          layers.empty() ? std::string("none") : fmt::format("{{{}}}", fmt::join(layers, ", "));
      out(fmt::format("{:<6} {:<26} {:>9.1f} {:>8} {:>13.1f} {:>9} {:>10.1f} {:>9}\n", cfg.name,
                      shown, 1e3 * r.step, k == 0 ? "peer" : relative(r.step, rows[0].step),
                      mib(r.rss), k == 0 ? "peer" : relative(r.rss, rows[0].rss), mib(r.stash),
                      k == 0 ? "peer" : relative(r.stash, rows[0].stash)));
    }
  }
  if (o.json) {
    nlohmann::ordered_json j;
    j["name"] = "recompute_end";
    j["losses_bitwise_equal"] = equal;
    j["failures"] = failures;
    j["disturbed"] = disturbed;
    out(j.dump() + "\n");
  } else {
    out(fmt::format(
        "\nlosses of every run bitwise equal: {}\nstash: the activation stash the stages "
        "allocated plus the recompute scratch (StageWorker::stash_bytes, "
        "recompute_scratch_bytes)\n{}",
        equal ? "yes" : "NO", interference_summary(disturbed) + "\n"));
  }
  if (!equal) {
    fmt::print(stderr, "actorpipe-bench recompute: the configurations' losses differ\n");
    return 1;
  }
  return failures > 0 ? 1 : 0;
}

}  // namespace actorpipe::bench
