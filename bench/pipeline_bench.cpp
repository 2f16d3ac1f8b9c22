// `actorpipe-bench pipeline`: profiles the layers, times every mode as one stage on 1 and 2
// threads and as two stages, the compute-free overhead runs and the GPipe peer; reports them.
#include "bench/pipeline_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "bench/bench_shapes.hpp"
#include "bench/correction_bench.hpp"
#include "bench/layer_profile.hpp"
#include "bench/machine.hpp"
#include "bench/pipe_peer.hpp"
#include "bench/pipeline_options.hpp"
#include "bench/pipeline_prediction.hpp"
#include "bench/pipeline_timing.hpp"
#include "bench/precision_bench.hpp"
#include "bench/step_timing.hpp"
#include "bench/subprocess.hpp"

namespace actorpipe::bench {

namespace {

using json = nlohmann::ordered_json;

// Targets: flushing modes within 3% of m/(m+d-1)·d, asynchronous modes at least 1.8x on two
// stages; the simulator within 10% of each measurement; the engine's own cost per microbatch
// under 20 µs and under 1% of a stage's compute.
constexpr double kIdealTolerance = 0.03;
constexpr double kAsyncTarget = 1.8;
constexpr double kPredictionTolerance = 0.10;
constexpr double kOverheadMaxUs = 20.0;
constexpr double kOverheadMaxFraction = 0.01;

// `mode` on `stages` stages of `counts` layers each, m microbatches of `shape` per step after
// `warmup` untimed steps; threads, timed steps, runs and skip_compute are left to the caller.
PipelineRunSpec run_spec(const BenchShape& shape, Mode mode, int stages,
                         const std::vector<int>& counts, int m, int warmup) {
  PipelineRunSpec spec;
  spec.model = shape.model;
  spec.B = shape.B;
  spec.T = shape.T;
  spec.mode = mode;
  spec.stages = stages;
  spec.microbatches = m;
  spec.partition = counts;
  spec.warmup = warmup;
  return spec;
}

std::string label(int stages, int threads, bool split_backward = true) {
  return fmt::format("{} stage{} x {} thread{}{}", stages, stages == 1 ? "" : "s", threads,
                     threads == 1 ? "" : "s", stages > 1 && !split_backward ? ", 1-pass B" : "");
}

double ideal_ratio(int m, int d) {
  return static_cast<double>(m) / (m + d - 1) * d;
}

json or_null(const std::optional<double>& v) {
  return v ? json(*v) : json(nullptr);
}

json or_null(const std::optional<bool>& v) {
  return v ? json(*v) : json(nullptr);
}

std::vector<double> scaled(const std::vector<double>& v, double f) {
  std::vector<double> out;
  for (double x : v) out.push_back(x * f);
  return out;
}

double stage_sum(const LayerProfile& p, const std::vector<int>& counts, int stage, bool fb) {
  int first = 0;
  for (int r = 0; r < stage; ++r) first += counts[static_cast<size_t>(r)];
  double s = 0.0;
  for (int i = first; i < first + counts[static_cast<size_t>(stage)]; ++i) {
    const LayerCost& c = p.layers[static_cast<size_t>(i)];
    s += fb ? c.forward + c.backward : c.update;
  }
  return s;
}

/// Per stage: the busy time of one step the simulator's costs imply (every F, B and update of
/// the step), in seconds.
std::vector<double> simulated_busy(const CostModel& c, Mode mode, int m) {
  std::vector<double> out;
  for (size_t r = 0; r < c.forward.size(); ++r) {
    const double opt = c.optimizer.empty() ? 0.0 : c.optimizer[r];
    out.push_back(m * (c.forward[r] + c.backward[r]) + (mode == Mode::pipedream ? m : 1) * opt);
  }
  return out;
}

/// One configuration of the efficiency table.
struct RunRecord {
  Mode mode = Mode::gpipe;
  int stages = 1;
  int threads = 1;
  bool split = true;  // pipeline.split_backward; off only in the comparison rows
  std::vector<int> counts;
  bool ok = false;
  std::string error;
  PipelineRunResult r;
  std::optional<PipelinePrediction> predicted;
  std::string prediction_error;  // why there is no prediction
  std::optional<double> ratio_1x1, ratio_1x2, ideal;
  Interference other;  // what ran besides the benchmark during the run

  std::optional<double> predicted_tokens_per_s(int tokens_per_step) const {
    if (!predicted || !(predicted->step_seconds > 0)) return std::nullopt;
    return tokens_per_step / predicted->step_seconds;
  }
  std::optional<double> prediction_err(int tokens_per_step) const {
    auto p = predicted_tokens_per_s(tokens_per_step);
    if (!p || !ok) return std::nullopt;
    return *p / r.tokens_per_s - 1.0;
  }
  /// The efficiency target of a two-stage run and whether it was met.
  std::string target() const {
    if (stages < 2 || !split) return "";
    if (is_synchronous(mode)) return fmt::format("within {:.0f}% of ideal", kIdealTolerance * 100);
    return fmt::format(">= {:.1f}x", kAsyncTarget);
  }
  std::optional<bool> met() const {
    if (stages < 2 || !split || !ratio_1x1) return std::nullopt;
    if (is_synchronous(mode)) return *ratio_1x1 >= (1.0 - kIdealTolerance) * *ideal;
    return *ratio_1x1 >= kAsyncTarget;
  }
};

json run_json(const RunRecord& rec, const BenchShape& shape, int m) {
  const int tokens = m * shape.B * shape.T;
  json j;
  j["name"] = "pipeline_run";
  j["shape"] = shape.name;
  j["mode"] = std::string(to_string(rec.mode));
  j["stages"] = rec.stages;
  j["threads_per_stage"] = rec.threads;
  j["split_backward"] = rec.split;
  j["microbatches"] = m;
  j["partition"] = rec.counts;
  j["ok"] = rec.ok;
  if (!rec.ok) j["error"] = rec.error;
  j["tokens_per_s"] = rec.ok ? json(rec.r.tokens_per_s) : json(nullptr);
  j["step_ms"] = rec.ok ? json(rec.r.step_seconds * 1e3) : json(nullptr);
  j["step_ms_all"] = scaled(rec.r.step_seconds_all, 1e3);
  j["stage_busy"] = rec.r.stage_busy;
  j["measured_busy_ms"] = scaled(rec.r.stage_busy, rec.r.step_seconds * 1e3);
  j["cpu_share"] =
      rec.r.timed_seconds > 0 ? json(rec.r.cpu_seconds / rec.r.timed_seconds) : json(nullptr);
  j["first_loss"] = rec.ok ? json(rec.r.first_loss) : json(nullptr);
  j["ratio_to_1x1"] = or_null(rec.ratio_1x1);
  j["ratio_to_1x2"] = or_null(rec.ratio_1x2);
  j["ideal_ratio"] = or_null(rec.ideal);
  j["fraction_of_ideal"] =
      rec.ratio_1x1 && rec.ideal ? json(*rec.ratio_1x1 / *rec.ideal) : json(nullptr);
  j["target"] = rec.target().empty() ? json(nullptr) : json(rec.target());
  j["meets_target"] = or_null(rec.met());
  j["predicted_tokens_per_s"] = or_null(rec.predicted_tokens_per_s(tokens));
  j["predicted_step_ms"] = rec.predicted ? json(rec.predicted->step_seconds * 1e3) : json(nullptr);
  j["prediction_error"] = or_null(rec.prediction_err(tokens));
  auto err = rec.prediction_err(tokens);
  j["prediction_within_target"] =
      err ? json(std::abs(*err) <= kPredictionTolerance) : json(nullptr);
  if (rec.predicted) {
    j["simulated_stage_ms"] = {
        {"forward", scaled(rec.predicted->costs.forward, 1e3)},
        {"backward", scaled(rec.predicted->costs.backward, 1e3)},
        {"backward_weight", scaled(rec.predicted->costs.backward_weight, 1e3)},
        {"optimizer", scaled(rec.predicted->costs.optimizer, 1e3)}};
    j["simulated_busy_ms"] = scaled(simulated_busy(rec.predicted->costs, rec.mode, m), 1e3);
  } else {
    j["prediction_note"] = rec.prediction_error;
  }
  add_interference(j, rec.other);
  return j;
}

std::string fmt_opt(const std::optional<double>& v, const char* f) {
  return v ? fmt::format(fmt::runtime(f), *v) : std::string("-");
}

std::string run_row(const RunRecord& rec, int tokens_per_step) {
  if (!rec.ok)
    return fmt::format("{:<10} {:<31} FAILED: {}\n", to_string(rec.mode),
                       label(rec.stages, rec.threads, rec.split), rec.error);
  std::string busy;
  for (double b : rec.r.stage_busy) busy += fmt::format("{}{:.2f}", busy.empty() ? "" : " ", b);
  std::string of_ideal = rec.ratio_1x1 && rec.ideal
                             ? fmt::format("{:.1f}%", 100.0 * *rec.ratio_1x1 / *rec.ideal)
                             : "-";
  std::string target = "-";
  if (auto met = rec.met()) target = rec.target() + (*met ? " ok" : " MISSED");
  auto err = rec.prediction_err(tokens_per_step);
  return fmt::format(
      "{:<10} {:<31} {:>9.1f} {:>9.0f}  {:<10} {:>6} {:>6} {:>8}  {:<24} {:>9} {:>7} {}\n",
      to_string(rec.mode), label(rec.stages, rec.threads, rec.split), rec.r.tokens_per_s,
      rec.r.step_seconds * 1e3, busy, fmt_opt(rec.ratio_1x1, "{:.2f}x"),
      fmt_opt(rec.ideal, "{:.2f}x"), of_ideal, target,
      fmt_opt(rec.predicted_tokens_per_s(tokens_per_step), "{:.1f}"),
      err ? fmt::format("{:+.1f}%", *err * 100) : std::string("-"), interference_cell(rec.other));
}

std::string run_header() {
  return fmt::format("{:<10} {:<31} {:>9} {:>9}  {:<10} {:>6} {:>6} {:>8}  {:<24} {:>9} {:>7} {}\n",
                     "mode", "configuration", "tokens/s", "step ms", "busy", "x 1x1", "ideal",
                     "of ideal", "target", "simulated", "error", "other");
}

}  // namespace

int run_pipeline_bench(std::span<const std::string> args) {
  auto parsed = parse_pipeline_options(args);
  if (!parsed) {
    fmt::print(stderr, "actorpipe-bench pipeline: {}\n", parsed.error().message);
    return 2;
  }
  const PipelineBenchOptions& o = *parsed;
  if (o.help) {
    fmt::print("{}", pipeline_usage());
    return 0;
  }
  const BenchShape shape = find_bench_shape(o.shape).value();
  const int m = o.microbatches;
  const int layers = shape.model.depth + 2;
  const int tokens_per_step = m * shape.B * shape.T;
  const OptimizerOptions opt;  // the engine's default optimizer (AdamW, clipping at 1.0)
  std::string command = "actorpipe-bench pipeline";
  for (const std::string& a : args) command += " " + a;
  const Interference start = sample_interference(std::chrono::milliseconds(500));
  const std::string machine = describe_machine();
  warn_if_busy("actorpipe-bench pipeline", start);
  if (!o.partition.empty() && o.partition[0] + o.partition[1] != layers) {
    fmt::print(stderr,
               "actorpipe-bench pipeline: --partition {},{}: the counts add up to {}, but {} has "
               "{} layers (embedding, {} blocks, head)\n",
               o.partition[0], o.partition[1], o.partition[0] + o.partition[1], shape.name, layers,
               shape.model.depth);
    return 2;
  }
  auto out = [](const std::string& s) {
    fmt::print("{}", s);
    std::fflush(stdout);
  };

  // 1. per-layer profile, at the thread counts of the stages
  auto prof1 = profile_layers(shape.model, opt, shape.B, shape.T, 1, o.profile_reps);
  if (!prof1) {
    fmt::print(stderr, "actorpipe-bench pipeline: profile: {}\n", prof1.error().message);
    return 1;
  }
  auto prof2 = profile_layers(shape.model, opt, shape.B, shape.T, 2, o.profile_reps);
  if (!prof2) {
    fmt::print(stderr, "actorpipe-bench pipeline: profile: {}\n", prof2.error().message);
    return 1;
  }
  // 1 thread with the other core busy: what a stage of the two-stage runs sees
  auto prof1l = profile_layers_loaded(shape.model, opt, shape.B, shape.T, 1, o.profile_reps, 1);
  if (!prof1l) {
    fmt::print(stderr, "actorpipe-bench pipeline: profile: {}\n", prof1l.error().message);
    return 1;
  }
  // the profile a configuration's prediction uses: its thread count, and the other core busy
  // when there are two stages
  auto profile_for = [&](int stages, int threads) -> const LayerProfile& {
    return threads == 2 ? *prof2 : stages == 2 ? *prof1l : *prof1;
  };
  std::vector<int> split = o.partition;
  if (split.empty()) {
    std::vector<double> fb;
    for (const LayerCost& c : prof1l->layers) fb.push_back(c.forward + c.backward);
    split = balanced_partition(fb, 2).value();
  }
  const std::string split_source =
      o.partition.empty() ? "balanced by the profile's F+B at 1 thread, other core busy"
                          : "--partition";

  // whole layers per stage: what the partition allows each mode, by the simulator fed one
  // profile (the loaded one) for both pipelines, so that only the split and the schedule differ
  // (and for gpipe and 1f1b with a one-pass backward)
  std::vector<std::pair<Mode, double>> partition_allows, partition_allows_one_pass;
  for (Mode mode : o.modes) {
    auto one = predict_pipeline(*prof1l, mode, std::vector<int>{layers}, m, o.warmup, o.reps);
    auto two = predict_pipeline(*prof1l, mode, split, m, o.warmup, o.reps);
    if (one && two && two->step_seconds > 0)
      partition_allows.emplace_back(mode, one->step_seconds / two->step_seconds);
    if (!is_synchronous(mode)) continue;
    auto two_one_pass = predict_pipeline(*prof1l, mode, split, m, o.warmup, o.reps, false);
    if (one && two_one_pass && two_one_pass->step_seconds > 0)
      partition_allows_one_pass.emplace_back(mode, one->step_seconds / two_one_pass->step_seconds);
  }

  if (o.json) {
    json s;
    s["name"] = "pipeline_setup";
    s["shape"] = shape.name;
    s["describe"] = shape.describe();
    s["microbatches"] = m;
    s["tokens_per_step"] = tokens_per_step;
    s["partition"] = split;
    s["partition_source"] = split_source;
    s["warmup"] = o.warmup;
    s["reps"] = o.reps;
    s["machine"] = machine;
    json at_start;
    add_interference(at_start, start);
    s["interference_at_start"] = at_start;
    s["command"] = command;
    json allows = json::object();
    for (const auto& [mode, ratio] : partition_allows) allows[std::string(to_string(mode))] = ratio;
    s["partition_allows_ratio"] = allows;
    json allows_one_pass = json::object();
    for (const auto& [mode, ratio] : partition_allows_one_pass)
      allows_one_pass[std::string(to_string(mode))] = ratio;
    s["partition_allows_ratio_one_pass_backward"] = allows_one_pass;
    out(s.dump() + "\n");
    for (const LayerProfile* p : {&*prof1, &*prof2, &*prof1l}) {
      json j;
      j["name"] = "pipeline_profile";
      j["threads"] = p->threads;
      j["load_threads"] = p->load_threads;
      j["reps"] = p->reps;
      json ls = json::array();
      for (const LayerCost& c : p->layers)
        ls.push_back({{"layer", c.name},
                      {"forward_ms", c.forward * 1e3},
                      {"backward_ms", c.backward * 1e3},
                      {"backward_weight_ms", c.backward_weight * 1e3},
                      {"update_ms", c.update * 1e3},
                      {"copy_ms", c.copy * 1e3},
                      {"predict_ms", c.predict * 1e3}});
      j["layers"] = ls;
      out(j.dump() + "\n");
    }
  } else {
    out(fmt::format(
        "actorpipe-bench pipeline: GPT {} ({}), m = {} microbatches per step ({} tokens)\n",
        shape.name, shape.describe(), m, tokens_per_step));
    out(fmt::format("machine: {}; other processes at the start: {} cores\ncommand: {}\n", machine,
                    interference_cell(start), command));
    out(fmt::format(
        "timing: each configuration trains {} step{} on the actor engine (synthetic data, AdamW, "
        "clipping 1.0);\n  a step's time is between the completions (every stage's update "
        "committed) of consecutive steps, median of {} after {} untimed\n",
        o.warmup + o.reps, o.warmup + o.reps == 1 ? "" : "s", o.reps, o.warmup));
    out(
        fmt::format("\nper-layer profile, ms per microbatch (median of {} calls; 1t, 2t: alone on "
                    "a Context of 1 or 2 threads;\n  1t+load: 1 thread while another thread "
                    "runs the same profile, as a stage of the two-stage runs sees it):\n",
                    o.profile_reps));
    out(fmt::format("{:<18} {:>8} {:>8} {:>8} {:>7} {:>8} {:>8} {:>8} {:>9} {:>9} {:>10}\n",
                    "layer", "F 1t", "B 1t", "update", "copy", "predict", "F 2t", "B 2t",
                    "F 1t+load", "B 1t+load", "Bw 1t+load"));
    for (size_t i = 0; i < prof1->layers.size(); ++i) {
      const LayerCost& a = prof1->layers[i];
      const LayerCost& b = prof2->layers[i];
      const LayerCost& c = prof1l->layers[i];
      out(fmt::format(
          "{:<18} {:>8.2f} {:>8.2f} {:>8.2f} {:>7.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>9.2f} "
          "{:>9.2f} {:>10.2f}\n",
          a.name, a.forward * 1e3, a.backward * 1e3, a.update * 1e3, a.copy * 1e3, a.predict * 1e3,
          b.forward * 1e3, b.backward * 1e3, c.forward * 1e3, c.backward * 1e3,
          c.backward_weight * 1e3));
    }
    double solo = 0.0, loaded = 0.0;
    for (size_t i = 0; i < prof1->layers.size(); ++i) {
      solo += prof1->layers[i].forward + prof1->layers[i].backward;
      loaded += prof1l->layers[i].forward + prof1l->layers[i].backward;
    }
    out(
        fmt::format("F+B of the whole model at 1 thread: {:.1f} ms alone, {:.1f} ms with the "
                    "other core busy ({:+.1f}%)\n",
                    solo * 1e3, loaded * 1e3, 100.0 * (loaded / solo - 1.0)));
    const double s0 = stage_sum(*prof1l, split, 0, true), s1 = stage_sum(*prof1l, split, 1, true);
    out(fmt::format("two-stage partition: [{}, {}] ({}; F+B per microbatch {:.1f} / {:.1f} ms)\n",
                    split[0], split[1], split_source, 1e3 * s0, 1e3 * s1));
    std::string allowed;
    for (const auto& [mode, ratio] : partition_allows) {
      allowed += fmt::format("{}{} {:.2f}x", allowed.empty() ? "" : ", ", to_string(mode), ratio);
      if (!is_synchronous(mode)) continue;
      allowed += fmt::format(" ({:.1f}% of the ideal", 100.0 * ratio / ideal_ratio(m, 2));
      for (const auto& [mode1, ratio1] : partition_allows_one_pass)
        if (mode1 == mode)
          allowed += fmt::format("; one-pass B {:.1f}%", 100.0 * ratio1 / ideal_ratio(m, 2));
      allowed += ")";
    }
    out(fmt::format(
        "  the larger stage holds {:.1f}% of the F+B; with this partition the simulator, fed the "
        "same profile for\n  one and two stages, puts two stages at {}\n",
        100.0 * std::max(s0, s1) / (s0 + s1), allowed));
    if (!o.overhead_only) {
      out(fmt::format(
          "\npipeline efficiency (x 1x1: against the same mode on 1 stage x 1 thread; ideal: "
          "m/(m+d-1)*d for gpipe and 1f1b;\n  busy: per stage, share of the timed steps in compute "
          "and updates; simulated: the simulator fed the profile;\n  other: cores that other "
          "processes and the hypervisor took during the run, BUSY from {:.1f}):\n",
          kBusyCores));
      out(run_header());
    }
  }

  // 2. every mode on 1 stage x 1 thread, 1 stage x 2 threads, 2 stages x 1 thread
  int failures = 0;
  int disturbed = 0;  // measurements during which other work took kBusyCores or more
  std::vector<RunRecord> runs;
  // gpipe and 1f1b also run two stages with a one-pass backward (pipeline.split_backward off):
  // the share of their bubble the split removes, side by side
  struct Configuration {
    int stages, threads;
    bool split;
  };
  for (Mode mode : o.overhead_only ? std::vector<Mode>{} : o.modes) {
    std::optional<double> tps11, tps12;
    std::vector<Configuration> configurations = {{1, 1, true}, {1, 2, true}, {2, 1, true}};
    if (is_synchronous(mode)) configurations.push_back({2, 1, false});
    for (auto [stages, threads, split_backward] : configurations) {
      RunRecord rec;
      rec.mode = mode;
      rec.stages = stages;
      rec.threads = threads;
      rec.split = split_backward;
      rec.counts = stages == 1 ? std::vector<int>{layers} : split;
      PipelineRunSpec spec = run_spec(shape, mode, stages, rec.counts, m, o.warmup);
      spec.threads_per_stage = threads;
      spec.split_backward = split_backward;
      spec.reps = o.reps;
      const CpuSnapshot before = cpu_snapshot();
      auto res = measure_pipeline(spec);
      rec.other = interference(before, cpu_snapshot());
      disturbed += distorted(rec.other) ? 1 : 0;
      if (res) {
        rec.ok = true;
        rec.r = std::move(*res);
      } else {
        rec.error = res.error().message;
        ++failures;
      }
      auto pred = predict_pipeline(profile_for(stages, threads), mode, rec.counts, m, o.warmup,
                                   o.reps, split_backward);
      if (pred) {
        rec.predicted = std::move(*pred);
      } else {
        rec.prediction_error = pred.error().message;
      }
      if (rec.ok) {
        if (stages == 1 && threads == 1) tps11 = rec.r.tokens_per_s;
        if (stages == 1 && threads == 2) tps12 = rec.r.tokens_per_s;
        if (tps11 && !(stages == 1 && threads == 1)) rec.ratio_1x1 = rec.r.tokens_per_s / *tps11;
        if (tps12 && stages == 2 && split_backward) rec.ratio_1x2 = rec.r.tokens_per_s / *tps12;
        if (stages == 2 && is_synchronous(mode)) rec.ideal = ideal_ratio(m, stages);
      }
      out(o.json ? run_json(rec, shape, m).dump() + "\n" : run_row(rec, tokens_per_step));
      runs.push_back(std::move(rec));
    }
  }
  if (!o.json && !runs.empty()) {
    out("\n2 stages x 1 thread against 1 stage x 2 threads (tokens/s ratio):\n");
    for (const RunRecord& r : runs) {
      if (r.stages == 2 && r.split)
        out(fmt::format("  {:<10} {}\n", to_string(r.mode), fmt_opt(r.ratio_1x2, "{:.3f}x")));
    }
  }

  if (!o.json && !runs.empty()) {
    out("\nstage compute per step, ms (measured: busy share x step time; profile: m(F+B) + "
        "updates as the simulator sees them) and the process's CPU use (cores):\n");
    for (const RunRecord& r : runs) {
      if (!r.ok || !r.predicted) continue;
      const std::vector<double> sim = simulated_busy(r.predicted->costs, r.mode, m);
      std::string cells;
      for (size_t k = 0; k < sim.size(); ++k) {
        const double meas = r.r.stage_busy[k] * r.r.step_seconds;
        cells += fmt::format("  stage {}: {:>8.0f} measured {:>8.0f} profile ({:+.1f}%)", k,
                             meas * 1e3, sim[k] * 1e3, 100.0 * (meas / sim[k] - 1.0));
      }
      out(fmt::format("  {:<10} {:<31} cpu {:.2f}{}\n", to_string(r.mode),
                      label(r.stages, r.threads, r.split),
                      r.r.timed_seconds > 0 ? r.r.cpu_seconds / r.r.timed_seconds : 0.0, cells));
    }
  }

  // 3. the engine's own cost: the same schedules with no compute
  if (o.overhead_steps > 0) {
    if (!o.json)
      out(fmt::format(
          "\nengine overhead: the same schedules with no compute (skip_compute), {} runs of {} "
          "steps after {} untimed;\n  per microbatch = a run's timed steps / (steps x m), median "
          "over runs; fraction of the smallest stage's F+B (1 thread, profile);\n  cpu: CPU "
          "time of every thread of the process per microbatch; other: cores other processes and "
          "the hypervisor took during the runs\n"
          "{:<10} {:>6} {:>14} {:>10} {:>16} {:>10}  {:<26} {}\n",
          o.reps, o.overhead_steps, o.warmup, "mode", "stages", "us/microbatch", "cpu us",
          "stage F+B us", "fraction", "target (< 20 us and < 1%)", "other"));
    for (Mode mode : o.modes) {
      for (int stages : {1, 2}) {
        const std::vector<int> counts = stages == 1 ? std::vector<int>{layers} : split;
        PipelineRunSpec spec = run_spec(shape, mode, stages, counts, m, o.warmup);
        spec.skip_compute = true;
        spec.reps = o.overhead_steps;
        spec.runs = o.reps;
        const CpuSnapshot before = cpu_snapshot();
        auto res = measure_pipeline(spec);
        const Interference other = interference(before, cpu_snapshot());
        disturbed += distorted(other) ? 1 : 0;
        double compute = 0.0;
        for (int r = 0; r < stages; ++r) {
          const double s = stage_sum(*prof1, counts, r, true);
          compute = r == 0 ? s : std::min(compute, s);
        }
        json j;
        j["name"] = "pipeline_overhead";
        j["shape"] = shape.name;
        j["mode"] = std::string(to_string(mode));
        j["stages"] = stages;
        j["microbatches"] = m;
        j["ok"] = res.ok();
        if (!res) {
          ++failures;
          j["error"] = res.error().message;
          out(o.json ? j.dump() + "\n"
                     : fmt::format("{:<10} {:>6} FAILED: {}\n", to_string(mode), stages,
                                   res.error().message));
          continue;
        }
        std::vector<double> per_run;  // µs per microbatch, one per run
        for (int k = 0; k < spec.runs; ++k) {
          double sum = 0.0;
          for (int s = 0; s < spec.reps; ++s)
            sum += res->step_seconds_all[static_cast<size_t>(k * spec.reps + s)];
          per_run.push_back(sum / (spec.reps * m) * 1e6);
        }
        const double us = median(per_run);
        const double cpu_us =
            res->cpu_seconds / (static_cast<double>(spec.runs) * spec.reps * m) * 1e6;
        const double fraction = us * 1e-6 / compute;
        const bool met = us < kOverheadMaxUs && fraction < kOverheadMaxFraction;
        j["us_per_microbatch"] = us;
        j["us_per_microbatch_runs"] = per_run;
        j["cpu_us_per_microbatch"] = cpu_us;
        j["stage_compute_us"] = compute * 1e6;
        j["fraction"] = fraction;
        j["meets_target"] = met;
        add_interference(j, other);
        out(o.json
                ? j.dump() + "\n"
                : fmt::format("{:<10} {:>6} {:>14.1f} {:>10.1f} {:>16.0f} {:>9.4f}%  {:<26} {}\n",
                              to_string(mode), stages, us, cpu_us, compute * 1e6, fraction * 100,
                              met ? "ok" : "MISSED", interference_cell(other)));
      }
    }
  }

  // 4. PyTorch's GPipe: 2 partitions at the same cut, m chunks, next to the unsplit model
  if (o.peer && !o.overhead_only) {
    const std::string script = peer_script_path(o.peer_script, "torch_pipe.py");
    if (!o.json)
      out(fmt::format(
          "\nPyTorch GPipe peer: Pipe(2 partitions [{}, {}], chunks={}, checkpoint=\"never\") and "
          "the unsplit model with gradient accumulation, same GPT and step;\n  median of {} "
          "steps after {}; x unsplit 1t: against the unsplit model on 1 thread\n",
          split[0], split[1], m, o.reps, o.warmup));
    std::optional<double> unsplit1;
    for (int threads : {1, 2}) {
      const auto argv =
          pipe_peer_argv(o.python, script, shape, opt, m, split[0], threads, o.reps, o.warmup);
      const std::string how = describe_pipe_peer_command(argv, threads);
      PipePeerResult p =
          run_pipe_peer(o.python, script, shape, opt, m, split[0], threads, o.reps, o.warmup);
      if (!p.ran) {
        fmt::print(stderr, "actorpipe-bench pipeline: GPipe peer: {}\n", p.error);
        json j{{"name", "pipeline_peer"}, {"threads", threads}, {"ran", false},
               {"missing", p.missing},    {"error", p.error},   {"command", how}};
        out(o.json ? j.dump() + "\n"
                   : fmt::format("  {} thread{}: no peer measurement ({}); actorpipe's figures "
                                 "only\n",
                                 threads, threads == 1 ? "" : "s", p.error));
        if (p.missing) break;
        continue;
      }
      if (threads == 1) unsplit1 = p.unsplit.tokens_per_s;
      if (!o.json) out(fmt::format("  run as: {}\n", how));
      for (const auto& [variant, v] :
           {std::pair<std::string, const PipePeerVariant*>{"unsplit", &p.unsplit},
            std::pair<std::string, const PipePeerVariant*>{"pipe", &p.pipe}}) {
        std::optional<double> ratio;
        if (unsplit1) ratio = v->tokens_per_s / *unsplit1;
        if (o.json) {
          json j;
          j["name"] = "pipeline_peer";
          j["shape"] = shape.name;
          j["ran"] = true;
          j["variant"] = variant;
          j["threads"] = p.threads;
          j["microbatches"] = m;
          j["partition"] = variant == "pipe" ? json(split) : json(std::vector<int>{layers});
          j["tokens_per_s"] = v->tokens_per_s;
          j["step_ms"] = v->step_ms;
          j["step_ms_all"] = v->step_ms_all;
          j["ratio_to_unsplit_1thread"] = or_null(ratio);
          j["torch"] = p.torch_version;
          j["attention"] = p.attention;
          j["parameters"] = p.parameters;
          j["command"] = how;
          out(j.dump() + "\n");
        } else {
          out(
              fmt::format("  {:<8} {} thread{}: {:>9.1f} tokens/s {:>9.0f} ms/step  x unsplit 1t "
                          "{}\n",
                          variant, p.threads, p.threads == 1 ? " " : "s", v->tokens_per_s,
                          v->step_ms, fmt_opt(ratio, "{:.2f}x")));
        }
      }
      if (!o.json && threads == 2)
        out(fmt::format("  torch {}, attention: {}, {} parameters, Pipe partitions: {}\n",
                        p.torch_version, p.attention, p.parameters, p.partitions));
    }
  }

  if (o.correction_rounds > 0 && !o.overhead_only)
    failures += run_correction_rows(shape, o.modes, split, m, correction_warmup(o), o.reps,
                                    o.correction_rounds, o.only_corrections, o.json, out);
  if (o.precision_rounds > 0 && !o.overhead_only)
    failures += run_precision_rows(shape, o.modes, split, m, o.warmup, o.reps, o.precision_rounds,
                                   o.json, out);

  if (o.json) {
    out(json{{"name", "pipeline_end"}, {"failures", failures}, {"distorted_runs", disturbed}}
            .dump() +
        "\n");
  } else {
    out("\n" + interference_summary(disturbed) + "\n");
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace actorpipe::bench
