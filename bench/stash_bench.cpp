// `actorpipe-bench stash`: pipeline.stash_precision = fp32 (the peer) and bf16 on the same bf16
// pipeline, alternating round by round, each run a fresh process (measure_in_child) reporting its
// peak RSS, the bytes its stages' weights hold (StageWorker::weight_bytes: resident pages and
// bf16 values, measured) and its step times; the losses must be the same bits.
#include "bench/stash_bench.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench/bench_shapes.hpp"
#include "bench/machine.hpp"
#include "bench/step_timing.hpp"

namespace actorpipe::bench {

Expected<RecomputeBenchOptions> parse_stash_options(std::span<const std::string> args) {
  RecomputeBenchOptions defaults;
  defaults.mode = Mode::twobw;
  defaults.precision = "bf16";
  defaults.stash_precision = "bf16";  // validated as the run measured: 2bw or pipedream
  auto o = parse_recompute_options(args, defaults);
  if (!o) return o.error();
  if (o->precision != "bf16")
    return make_error("--precision {}: the stash keeps bf16 operands, so it needs bf16",
                      o->precision);
  if (!o->child.empty()) return make_error("--child: not an option of actorpipe-bench stash");
  return o;
}

std::string stash_usage() {
  return R"(usage: actorpipe-bench stash [--shape NAME] [--mode MODE] [--stages D] [--microbatches M]
                             [--threads N] [--reps N] [--warmup N] [--rounds N] [--json]

Trains a GPT pipeline in bf16 (the actor engine, even partition) with pipeline.stash_precision =
fp32 (the peer) and bf16, each run in a fresh process, and prints per configuration the bytes
its stages' weights hold at the end (every version's resident pages, the bf16 stash, the bf16
copies the products read: StageWorker::weight_bytes), the process's peak RSS (getrusage) and the
median step time, each against fp32. Rounds alternate the two (round k starts with the k-th);
the figures are medians over the rounds. The losses of every run must be bitwise equal.
  --shape NAME        tiny | small | gpt2 (default small)
  --mode MODE         2bw | pipedream (default 2bw)
  --stages D          pipeline stages (default 2)
  --microbatches M    microbatches per step (default 4)
  --threads N         threads per stage (default 1)
  --reps N            timed steps per run (default 3), after --warmup N untimed (default 1)
  --rounds N          runs of each configuration (default 3)
  --json              JSON lines: stash_setup, one stash_config per configuration, stash_end
  --help              this text
)";
}

int run_stash_bench(std::span<const std::string> args) {
  auto parsed = parse_stash_options(args);
  if (!parsed) {
    fmt::print(stderr, "actorpipe-bench stash: {}\n", parsed.error().message);
    return 2;
  }
  const RecomputeBenchOptions o = *parsed;
  if (o.help) {
    fmt::print("{}", stash_usage());
    return 0;
  }
  const Interference start = sample_interference(std::chrono::milliseconds(500));
  const std::string machine = describe_machine();
  warn_if_busy("actorpipe-bench", start);
  auto out = [&](const std::string& s) {
    fmt::print("{}", s);
    std::fflush(stdout);
  };
  const BenchShape shape = find_bench_shape(o.shape).value();
  if (o.json) {
    nlohmann::ordered_json j;
    j["name"] = "stash_setup";
    j["shape"] = shape.name;
    j["mode"] = to_string(o.mode);
    j["stages"] = o.stages;
    j["microbatches"] = o.microbatches;
    j["threads"] = o.threads;
    j["machine"] = machine;
    out(j.dump() + "\n");
  } else {
    out(fmt::format(
        "actorpipe-bench stash: GPT {} ({}), {} in bf16, {} stages x {} thread{}, m = {}, even "
        "partition\nmachine: {}; other processes at the start: {} cores\n"
        "each configuration in a fresh process, {} round{} alternating, {} timed step{} after {} "
        "warm-up; medians\n\n",
        shape.name, shape.describe(), to_string(o.mode), o.stages, o.threads,
        o.threads == 1 ? "" : "s", o.microbatches, machine, interference_cell(start), o.rounds,
        o.rounds == 1 ? "" : "s", o.reps, o.reps == 1 ? "" : "s", o.warmup));
  }
  struct StashVariant {
    std::string stash;
    std::vector<MeasuredRun> runs;
    double step = 0, rss = 0, weights = 0;
  };
  std::vector<StashVariant> variants = {{"fp32", {}}, {"bf16", {}}};
  int failures = 0, disturbed = 0;
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t k = 0; k < variants.size(); ++k) {
      StashVariant& v = variants[(k + static_cast<size_t>(round)) % variants.size()];
      RecomputeBenchOptions run = o;
      run.stash_precision = v.stash;
      const CpuSnapshot before = cpu_snapshot();
      auto child = measure_in_child(run, "none");
      if (!child) {
        fmt::print(stderr, "actorpipe-bench stash: stash {}: {}\n", v.stash, child.error().message);
        ++failures;
        continue;
      }
      if (distorted(interference(before, cpu_snapshot()))) ++disturbed;
      v.runs.push_back(std::move(*child));
    }
  }
  bool equal = true;
  const std::vector<double>* first = nullptr;
  for (StashVariant& v : variants) {
    std::vector<double> steps, rss, weights;
    for (const MeasuredRun& r : v.runs) {
      if (first == nullptr) first = &r.losses;
      equal = equal && r.losses == *first;
      steps.push_back(median(r.step_seconds));
      rss.push_back(r.max_rss_bytes);
      weights.push_back(r.weight_bytes);
    }
    if (!steps.empty()) {
      v.step = median(steps);
      v.rss = median(rss);
      v.weights = median(weights);
    }
  }
  const StashVariant& peer = variants[0];
  auto vs = [](double x, double p) {
    return p > 0 ? fmt::format("{:+.1f}%", 100.0 * (x / p - 1.0)) : std::string("-");
  };
  if (!o.json) {
    out(fmt::format("{:<6} {:>9} {:>8} {:>12} {:>9} {:>13} {:>9}\n", "stash", "step ms", "vs fp32",
                    "weights MiB", "vs fp32", "peak RSS MiB", "vs fp32"));
  }
  for (const StashVariant& v : variants) {
    const bool is_peer = &v == &peer;
    if (o.json) {
      nlohmann::ordered_json j;
      j["name"] = "stash_config";
      j["stash_precision"] = v.stash;
      j["runs"] = v.runs.size();
      j["step_seconds"] = v.step;
      j["weight_bytes"] = v.weights;
      j["max_rss_bytes"] = v.rss;
      j["weights_vs_fp32"] = peer.weights > 0 ? v.weights / peer.weights : 0.0;
      j["rss_vs_fp32"] = peer.rss > 0 ? v.rss / peer.rss : 0.0;
      j["step_vs_fp32"] = peer.step > 0 ? v.step / peer.step : 0.0;
      out(j.dump() + "\n");
    } else {
      out(fmt::format("{:<6} {:>9.1f} {:>8} {:>12.1f} {:>9} {:>13.1f} {:>9}\n", v.stash,
                      1e3 * v.step, is_peer ? "peer" : vs(v.step, peer.step), mib(v.weights),
                      is_peer ? "peer" : vs(v.weights, peer.weights), mib(v.rss),
                      is_peer ? "peer" : vs(v.rss, peer.rss)));
    }
  }
  if (o.json) {
    nlohmann::ordered_json j;
    j["name"] = "stash_end";
    j["losses_bitwise_equal"] = equal;
    j["failures"] = failures;
    j["disturbed"] = disturbed;
    out(j.dump() + "\n");
  } else {
    out(fmt::format("\nlosses of every run bitwise equal: {}\n{}", equal ? "yes" : "NO",
                    interference_summary(disturbed) + "\n"));
  }
  if (!equal) {
    fmt::print(stderr, "actorpipe-bench stash: the two stashes' losses differ\n");
    return 1;
  }
  return failures > 0 ? 1 : 0;
}

}  // namespace actorpipe::bench
