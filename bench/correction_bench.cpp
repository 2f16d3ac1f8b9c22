// The delay corrections in the pipeline benchmark: throughput of each asynchronous mode without
// and with each correction, interleaved; the floats kept; the cost of one update.
#include "bench/correction_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>

#include "bench/pipeline_timing.hpp"
#include "bench/step_timing.hpp"
#include "bench/variant_rows.hpp"
#include "engine/execution/layer_optimizer.hpp"
#include "engine/model/model.hpp"
#include "kernels/context.hpp"
#include "kernels/optimizer.hpp"

namespace actorpipe::bench {

std::vector<std::string> corrections_of(Mode mode) {
  if (is_synchronous(mode)) return {};
  if (mode == Mode::xpipe) return {"none", "nesterov", "nadam"};
  return {"none", "nesterov", "nadam", "dc", "secant", "dc+nesterov", "secant+nesterov"};
}

CorrectionSettings correction_settings(const std::string& name) {
  if (name == "nadam") return {"nesterov", 0.004f};
  return {name, 0.0f};
}

double update_seconds(size_t n, const std::string& correction, int reps) {
  Context ctx(1);
  OptimizerOptions o;
  const CorrectionSettings settings = correction_settings(correction);
  o.delay_correction = settings.delay_correction;
  o.momentum_decay = settings.momentum_decay;
  o.dc_lambda = 1.0f;
  // m, v and what the correction keeps after them (secant: four arrays)
  std::vector<float> state(optimizer_state_floats(o, n), 0.0f);
  float* m = state.data();
  float* v = state.data() + n;
  std::fill(v, v + n, 1e-6f);
  std::vector<float> p(n, 0.01f), g(n, 1e-3f), older(n, 0.0f), delta(n, 0.0f);
  for (size_t i = 0; i < n; ++i) g[i] = 1e-3f * static_cast<float>((i % 7) + 1);
  AdamWParams hp;
  hp.lr = 1e-3f;
  hp.weight_decay = 0.1f;
  const DelayCorrection c = delay_correction(o, n, state.data(), delta.data(), 10);
  std::vector<double> times;
  for (int r = 0; r < reps + 1; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (needs_weight_change(o))  // the stage worker's Δ pass: newest minus stale version
      for (size_t i = 0; i < n; ++i) delta[i] = p[i] - older[i];
    adamw_update(ctx, p.data(), g.data(), m, v, n, hp, 10 + r, 1.0f, c);
    const auto t1 = std::chrono::steady_clock::now();
    if (r > 0) times.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  return median(times);
}

int run_correction_rows(const BenchShape& shape, std::span<const Mode> modes,
                        const std::vector<int>& counts, int m, int warmup, int reps, int rounds,
                        bool as_json, const std::function<void(const std::string&)>& out) {
  int failures = 0;
  size_t params = 0;
  {
    auto model = Model::build(shape.model);
    if (model)
      for (int i = 0; i < model->num_layers(); ++i) params += model->layer(i).param_floats();
  }
  if (!as_json) {
    out(fmt::format(
        "\ndelay corrections (optimizer.delay_correction), 2 stages x 1 thread, partition {}:{}, "
        "{} rounds interleaved, median tokens/s; kept: floats per job beside AdamW's m and v "
        "(Δ, and secant's four arrays in the optimizer state); update: one AdamW update of all "
        "{} parameters at 1 thread\n",
        counts[0], counts[1], rounds, params));
    out(fmt::format("  {:<10} {:<16} {:>10} {:>9} {:>12} {:>11} {:>9}\n", "mode", "correction",
                    "tokens/s", "x none", "kept floats", "update ms", "x none"));
  }
  std::map<std::string, double> update_ms;
  for (const std::string& corr : corrections_of(Mode::pipedream))
    update_ms[corr] = update_seconds(params, corr, 7) * 1e3;
  for (Mode mode : modes) {
    const std::vector<std::string> corrections = corrections_of(mode);
    if (corrections.empty()) continue;
    const PipelineRunSpec spec = two_stage_spec(shape, mode, counts, m, warmup, reps);
    std::vector<Variant> variants;
    for (const std::string& corr : corrections)
      variants.push_back({corr, [corr](PipelineRunSpec& s) {
                            const CorrectionSettings settings = correction_settings(corr);
                            s.delay_correction = settings.delay_correction;
                            s.momentum_decay = settings.momentum_decay;
                          }});
    const std::vector<VariantResult> results = run_variants(spec, variants, rounds);
    std::map<std::string, std::vector<double>> tps;
    std::map<std::string, size_t> kept;
    std::map<std::string, std::string> failed;
    for (size_t i = 0; i < corrections.size(); ++i) {
      const VariantResult& r = results[i];
      if (!r.ok()) {
        failed[corrections[i]] = r.error;
        ++failures;
        continue;
      }
      tps[corrections[i]] = r.tokens_per_s;
      // Δ (one float per parameter of the stage where there is one), and per such parameter
      // the optimizer state the correction adds
      OptimizerOptions o;
      o.delay_correction = correction_settings(corrections[i]).delay_correction;
      const size_t added =
          optimizer_state_floats(o, 1) - optimizer_state_floats(OptimizerOptions{}, 1);
      kept[corrections[i]] = r.last.delay_correction_floats * (1 + added);
    }
    const double base = tps["none"].empty() ? 0.0 : median(tps["none"]);
    for (const std::string& corr : corrections) {
      if (failed.count(corr)) {
        out(as_json
                ? nlohmann::json{{"name", "pipeline_correction"},
                                 {"mode", std::string(to_string(mode))},
                                 {"correction", corr},
                                 {"error", failed[corr]}}
                          .dump() +
                      "\n"
                : fmt::format("  {:<10} {:<16} FAILED: {}\n", to_string(mode), corr, failed[corr]));
        continue;
      }
      const double t = median(tps[corr]);
      const bool has_ratio = base > 0.0;
      const double ratio = has_ratio ? t / base : 0.0;
      const double u = update_ms[corr], u0 = update_ms["none"];
      if (as_json) {
        nlohmann::json j{{"name", "pipeline_correction"},
                         {"shape", shape.name},
                         {"mode", std::string(to_string(mode))},
                         {"correction", corr},
                         {"delay_correction", correction_settings(corr).delay_correction},
                         {"momentum_decay", correction_settings(corr).momentum_decay},
                         {"stages", 2},
                         {"microbatches", m},
                         {"partition", counts},
                         {"tokens_per_s", t},
                         {"tokens_per_s_all", tps[corr]},
                         {"kept_floats", kept[corr]},
                         {"update_ms", u},
                         {"update_ms_none", u0}};
        j["ratio_to_none"] = has_ratio ? nlohmann::json(ratio) : nlohmann::json(nullptr);
        out(j.dump() + "\n");
      } else {
        out(fmt::format("  {:<10} {:<16} {:>10.1f} {:>9} {:>12} {:>11.2f} {:>8.2f}x\n",
                        to_string(mode), corr, t,
                        has_ratio ? fmt::format("{:.3f}x", ratio) : std::string("-"), kept[corr], u,
                        u / u0));
      }
    }
  }
  return failures;
}

}  // namespace actorpipe::bench
