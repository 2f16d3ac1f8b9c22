// actorpipe-plan: the partition pipeline.partition = "auto" would take for a config, and why —
// the layer profile (measured or cached), a table per stage, the prediction and the runner-up.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "engine/config/config.hpp"
#include "engine/model/partition.hpp"
#include "engine/planner/width_depth.hpp"
#include "engine/profiler/auto_partition.hpp"
#include "engine/profiler/profile_cache.hpp"
#include "kernels/blas_core.hpp"
#include "transport/gloo_bandwidth.hpp"

using namespace actorpipe;

namespace {

constexpr int kExitError = 1;
constexpr int kExitUsage = 2;

constexpr const char* kUsage =
    R"(usage: actorpipe-plan [--config FILE] [--set section.key=value]... [--cache-dir DIR]
                      [--reprofile | --no-cache] [--reps N]
                      [--ranks R [--allreduce-bandwidth BYTES_PER_S]]

Prints the partition that pipeline.partition = "auto" takes for the config's model, mode, stages
and microbatches (under pipeline.memory_limit_mb) with the layers the stages will recompute
(pipeline.recompute; "auto": the planner's, for the configured partition unless that is "auto"
too), and why: the per-layer profile, a table per
stage (layers, forward and backward ms, bytes by kind, recomputed layers), the simulated step
time and bubble, and the runner-up. Without --config the defaults are used; each --set
overrides one key (docs/config.md). The profile is measured at pipeline.threads_per_stage
threads and cached per model and machine (docs/planner.md).
  --cache-dir DIR   the profile cache (default $ACTORPIPE_CACHE_DIR, $XDG_CACHE_HOME/actorpipe
                    or ~/.cache/actorpipe)
  --reprofile       measure again even when a cached profile matches, and cache the new one
  --no-cache        neither read nor write a cached profile
  --reps N          calls timed per layer and kind, medians (default 5)
  --ranks R         also rank every split of R processes into pipeline.replicas w × stages d
                    (w·d = R) by the simulated step with each update's all-reduce, runner-ups
                    included (docs/replicas.md)
  --allreduce-bandwidth BYTES_PER_S
                    bytes a member of the all-reduce sends per second (between hosts: your
                    network's); default: measured here, Gloo over loopback TCP
  --help            this text
Exit codes: 0 planned, 1 config error or no plan the engine can run, 2 bad argument.
)";

// "actorpipe-plan: error: first line" and the following lines of the message indented.
void print_error(const std::string& message) {
  std::string text = message;
  for (size_t p = text.find('\n'); p != std::string::npos; p = text.find('\n', p + 3))
    text.replace(p, 1, "\n  ");
  fmt::print(stderr, "actorpipe-plan: error: {}\n", text);
}

struct Args {
  std::string config;
  std::vector<std::string> sets;
  AutoPartitionOptions auto_options;
  bool help = false;
  int ranks = 0;                     // --ranks: 0 = no width × depth table
  double allreduce_bandwidth = 0.0;  // --allreduce-bandwidth: 0 = measure
};

Expected<Args> parse_args(int argc, char** argv) {
  Args a;
  bool reprofile = false, no_cache = false, have_config = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    std::string value;
    // --name VALUE or --name=VALUE
    auto valued = [&](std::string_view flag) -> Expected<bool> {
      if (arg == flag) {
        if (i + 1 >= argc) return make_error("{} needs a value", flag);
        value = argv[++i];
        return true;
      }
      if (arg.size() > flag.size() && arg.substr(0, flag.size()) == flag &&
          arg[flag.size()] == '=') {
        value = std::string(arg.substr(flag.size() + 1));
        return true;
      }
      return false;
    };
    if (arg == "--help" || arg == "-h") {
      a.help = true;
      continue;
    }
    if (arg == "--reprofile") {
      reprofile = true;
      continue;
    }
    if (arg == "--no-cache") {
      no_cache = true;
      continue;
    }
    bool handled = false;
    for (std::string_view flag :
         {"--config", "--set", "--cache-dir", "--reps", "--ranks", "--allreduce-bandwidth"}) {
      auto v = valued(flag);
      if (!v) return v.error();
      if (!*v) continue;
      handled = true;
      if (flag == "--config") {
        if (have_config) return make_error("--config given twice");
        if (value.empty()) return make_error("--config needs a file name");
        have_config = true;
        a.config = value;
      } else if (flag == "--set") {
        const size_t eq = value.find('='), dot = value.find('.');
        if (eq == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 >= eq)
          return make_error(
              "--set \"{}\": expected section.key=value, e.g. --set pipeline.stages=4", value);
        a.sets.push_back(value);
      } else if (flag == "--cache-dir") {
        if (value.empty()) return make_error("--cache-dir needs a directory");
        a.auto_options.cache_dir = value;
      } else if (flag == "--allreduce-bandwidth") {
        char* end = nullptr;
        errno = 0;
        const double x = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || errno != 0 || !(x > 0) || !std::isfinite(x))
          return make_error(
              "--allreduce-bandwidth: \"{}\" is not allowed: expected bytes per second > 0", value);
        a.allreduce_bandwidth = x;
      } else {
        char* end = nullptr;
        errno = 0;
        const long n = std::strtol(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || errno != 0 || n < 1 || n > 10000)
          return make_error("{}: \"{}\" is not allowed: expected an integer from 1 to 10000", flag,
                            value);
        (flag == "--reps" ? a.auto_options.reps : a.ranks) = static_cast<int>(n);
      }
      break;
    }
    if (handled) continue;
    return make_error("unknown argument \"{}\" (see --help)", arg);
  }
  if (reprofile && no_cache) return make_error("--reprofile and --no-cache: choose one");
  if (reprofile) a.auto_options.read_cache = false;
  if (no_cache) {
    a.auto_options.read_cache = false;
    a.auto_options.write_cache = false;
  }
  return a;
}

// 1234 -> "1234 B", then KiB, MiB, GiB with one decimal.
std::string bytes(std::int64_t n) {
  if (n < 1024) return fmt::format("{} B", n);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double x = static_cast<double>(n) / 1024.0;
  int u = 0;
  while (x >= 1024.0 && u < 3) {
    x /= 1024.0;
    ++u;
  }
  return fmt::format("{:.1f} {}", x, units[u]);
}

std::string counts(const std::vector<int>& v) {
  return fmt::format("[{}]", fmt::join(v, ", "));
}

std::string recomputed(const PartitionPlan& p, const StagePlan& s) {
  std::vector<int> r;
  for (int i = s.first_layer; i < s.first_layer + s.layers; ++i)
    if (static_cast<size_t>(i) < p.recompute.size() && p.recompute[static_cast<size_t>(i)])
      r.push_back(i);
  return r.empty() ? "none" : fmt::format("{{{}}}", fmt::join(r, ", "));
}

// The table of one plan's stages (in bf16 with the weight versions' copies).
void print_stages(const PartitionPlan& p, const std::vector<LayerCosts>& costs) {
  bool copies = false;
  for (const StagePlan& s : p.stages) copies = copies || s.bytes.weight_copies > 0;
  fmt::print("  {:<5} {:<9} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>9} {:>10}{}\n",
             "stage", "layers", "F ms", "B ms", "params", "grads", "optimizer", "versions",
             "activations", "total", "step ms", "recompute",
             copies ? fmt::format(" {:>11}", "bf16 copies") : "");
  for (size_t k = 0; k < p.stages.size(); ++k) {
    const StagePlan& s = p.stages[k];
    double f = 0, b = 0;
    for (int i = s.first_layer; i < s.first_layer + s.layers; ++i) {
      f += costs[static_cast<size_t>(i)].forward;
      b += costs[static_cast<size_t>(i)].backward;
    }
    fmt::print(
        "  {:<5} {:<9} {:>8.3f} {:>8.3f} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10} {:>9.3f} "
        "{:>10}{}\n",
        k, fmt::format("{} .. {}", s.first_layer, s.first_layer + s.layers - 1), 1e3 * f, 1e3 * b,
        bytes(s.bytes.parameters), bytes(s.bytes.gradients), bytes(s.bytes.optimizer),
        bytes(s.bytes.versions), bytes(s.bytes.activations), bytes(s.bytes.total()),
        1e3 * s.step_seconds, recomputed(p, s),
        copies ? fmt::format(" {:>11}", bytes(s.bytes.weight_copies)) : "");
  }
}

// The stage whose step time is the plan's bottleneck (the first of equals).
size_t slowest(const PartitionPlan& p) {
  size_t k = 0;
  for (size_t i = 1; i < p.stages.size(); ++i)
    if (p.stages[i].step_seconds > p.stages[k].step_seconds) k = i;
  return k;
}

// --ranks: every split of the processes into replicas × stages, ranked by the simulated step.
int width_depth(const Args& args, const Config& c, const AutoPartition& a, int T) {
  const PipelineOptions& pl = c.pipeline;
  PlannerOptions base = a.planner;
  base.microbatches = pl.microbatches;
  base.stage_speed.clear();
  if (args.allreduce_bandwidth > 0) {
    base.allreduce_bandwidth = args.allreduce_bandwidth;
    fmt::print("\nall-reduce: {:.1f} MB/s per member (--allreduce-bandwidth), no latency\n",
               base.allreduce_bandwidth / 1e6);
  } else {
    // a typical stage's gradients: half the model's
    std::int64_t grad = 0;
    for (const LayerCosts& l : a.costs) grad += l.gradient_bytes;
    const std::int64_t floats = std::max<std::int64_t>(1, grad / 2 / 4);
    auto cost = measure_all_reduce_cost(floats, 5);
    if (!cost) {
      print_error(cost.error().message);
      return kExitError;
    }
    base.allreduce_bandwidth = cost->bandwidth;
    base.allreduce_latency = cost->latency;
    fmt::print(
        "\nall-reduce: measured here, Gloo over loopback TCP, 2 members: {:.1f} MB/s per member "
        "({} of gradients in {:.3f} ms), latency {:.3f} ms\n",
        base.allreduce_bandwidth / 1e6, bytes(floats * 4), 1e3 * cost->large.seconds,
        1e3 * cost->latency);
  }
  auto wd = plan_width_depth(a.costs, base, args.ranks);
  if (!wd) {
    print_error(wd.error().message);
    return kExitError;
  }
  const double tokens = static_cast<double>(pl.microbatches) * pl.microbatch_size * T;
  fmt::print("\nwidth × depth for {} processes, {} microbatches of {}x{} tokens per step ({}):\n",
             args.ranks, pl.microbatches, pl.microbatch_size, T, pl.mode);
  fmt::print("  {:<4} {:>3} {:>3} {:<18} {:>12} {:>10} {:>14} {:>7}\n", "rank", "w", "d",
             "partition", "step ms", "tok/s", "all-reduce ms", "bubble");
  for (size_t i = 0; i < wd->ranked.size(); ++i) {
    const WidthDepthPlan& p = wd->ranked[i];
    fmt::print("  {:<4} {:>3} {:>3} {:<18} {:>12.3f} {:>10.0f} {:>14.3f} {:>7.3f}{}\n", i + 1,
               p.replicas, p.stages, counts(p.plan.layers_per_stage),
               1e3 * p.predicted_step_seconds, tokens / p.predicted_step_seconds,
               1e3 * p.allreduce_seconds, p.plan.predicted_bubble, i == 0 ? "  <- the plan" : "");
  }
  for (const std::string& s : wd->skipped) fmt::print("  left out: {}\n", s);
  const WidthDepthPlan& best = wd->ranked[0];
  fmt::print(
      "\nto use it: actorpipe-launch -n {} -- PROGRAM --set pipeline.replicas={} --set "
      "pipeline.stages={} --set pipeline.partition={}\n",
      args.ranks, best.replicas, best.stages,
      fmt::format("[{}]", fmt::join(best.plan.layers_per_stage, ",")));
  return 0;
}

int run(const Args& args) {
  auto config = load_config(args.config, args.sets);
  if (!config) {
    print_error(config.error().message);
    return kExitError;
  }
  const Config& c = *config;
  const PipelineOptions& pl = c.pipeline;
  const int T = pl.seq_len > 0 ? pl.seq_len : c.model.context;
  fmt::print(
      "actorpipe-plan: {} V{} C{} L{} ({} layers), B {} T {}, {} thread{} per stage, {} "
      "optimizer\n",
      c.model.arch == Arch::gpt ? "GPT" : "BERT", c.model.vocab_size, c.model.width, c.model.depth,
      c.model.depth + 2, pl.microbatch_size, T, pl.threads_per_stage,
      pl.threads_per_stage == 1 ? "" : "s", c.optimizer.kind);
  fmt::print("pipeline: {}, {} stages, {} microbatches per step, memory limit {}\n", pl.mode,
             pl.stages, pl.microbatches,
             pl.memory_limit_mb > 0 ? fmt::format("{} MiB per stage", pl.memory_limit_mb)
                                    : std::string("none"));
  auto a = plan_auto_partition(c, args.auto_options);
  if (!a) {
    print_error(a.error().message);
    return kExitError;
  }
  if (a->from_cache) {
    fmt::print("profile: read from the cache {} (measured with {} reps)\n", a->cache_path,
               a->profile.reps);
  } else {
    fmt::print(
        "profile: measured, {} reps ({}){}\n", a->profile.reps, a->cache_note,
        a->cache_path.empty() ? std::string() : fmt::format("; cached in {}", a->cache_path));
  }

  fmt::print("\nper layer, one microbatch (ms; bytes):\n");
  fmt::print("  {:<17} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10} {:>11} {:>10} {:>10}\n", "layer", "F",
             "B", "B weight", "update", "params", "optimizer", "activations", "recompute",
             "output");
  for (size_t i = 0; i < a->costs.size(); ++i) {
    const LayerCosts& l = a->costs[i];
    fmt::print("  {:<17} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>10} {:>10} {:>11} {:>10} {:>10}\n",
               a->profile.layers[i].name, 1e3 * l.forward, 1e3 * l.backward,
               1e3 * l.backward_weight, 1e3 * l.update, bytes(l.parameter_bytes),
               bytes(l.optimizer_bytes), bytes(l.activation_bytes),
               bytes(l.recompute_activation_bytes), bytes(l.output_bytes));
  }

  const PartitionPlan& plan = a->result.plan;
  const bool auto_recompute = pl.recompute.kind == RecomputeSpec::Kind::automatic;
  const bool fixed = !a->planner.layers_per_stage.empty();
  const std::vector<int> rc = recomputed_layers(a->recompute);
  fmt::print("\nplan: {} (the {}{}), recompute {} ({})\n", counts(plan.layers_per_stage),
             fixed ? "configured partition: the fastest recompute of each stage"
                   : "smallest slowest stage",
             pl.memory_limit_mb > 0 ? " whose every stage fits the limit" : "",
             rc.empty() ? std::string("none") : fmt::format("{{{}}}", fmt::join(rc, ", ")),
             auto_recompute
                 ? (pl.memory_limit_mb > 0 ? "pipeline.recompute = \"auto\": the planner's"
                                           : "pipeline.recompute = \"auto\" without a "
                                             "limit: none")
                 : "as pipeline.recompute says");
  print_stages(plan, a->costs);
  const size_t k = slowest(plan);
  fmt::print(
      "predicted step {:.3f} ms, bubble {:.3f} (the {} schedule simulated with these "
      "costs); bottleneck stage {} at {:.3f} ms per step\n",
      1e3 * plan.predicted_step_seconds, plan.predicted_bubble, pl.mode, k,
      1e3 * plan.bottleneck_seconds);
  if (a->result.runner_up) {
    const PartitionPlan& r = *a->result.runner_up;
    fmt::print(
        "\nrunner-up: {}: bottleneck stage {} at {:.3f} ms per step ({:+.1f}%), predicted "
        "step {:.3f} ms, bubble {:.3f}\n",
        counts(r.layers_per_stage), slowest(r), 1e3 * r.bottleneck_seconds,
        plan.bottleneck_seconds > 0 ? 100.0 * (r.bottleneck_seconds / plan.bottleneck_seconds - 1.0)
                                    : 0.0,
        1e3 * r.predicted_step_seconds, r.predicted_bubble);
    print_stages(r, a->costs);
    if (!a->result.ranked.empty() && a->result.ranked[0].layers_per_stage == r.layers_per_stage)
      fmt::print(
          "note: the simulator predicts the runner-up's step faster ({:.3f} ms against "
          "{:.3f} ms): the plan minimises the slowest stage, not the simulated step\n",
          1e3 * r.predicted_step_seconds, 1e3 * plan.predicted_step_seconds);
  } else if (fixed) {
    fmt::print("\nrunner-up: none (the partition is the configured one)\n");
  } else {
    fmt::print("\nrunner-up: none (no other partition into {} stages{})\n", pl.stages,
               pl.memory_limit_mb > 0 ? " fits" : "");
  }
  fmt::print("\nto use it: --set pipeline.partition={} --set pipeline.recompute={} or \"auto\"\n",
             fmt::format("[{}]", fmt::join(plan.layers_per_stage, ",")),
             rc.empty() ? std::string("none") : fmt::format("[{}]", fmt::join(rc, ",")));
  if (args.ranks > 0) return width_depth(args, c, *a, T);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto args = parse_args(argc, argv);
  if (!args) {
    print_error(args.error().message);
    return kExitUsage;
  }
  if (args->help) {
    fmt::print("{}", kUsage);
    return 0;
  }
  // the profile measured on the OpenBLAS kernels the trainers run (they switch at their start
  // too; the cache key names the kernels)
  if (const std::string done = use_fitting_blas_core(); !done.empty())
    fmt::print("actorpipe-plan: {}\n", done);
  return run(*args);
}
