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
#include "kernels/check.hpp"
#include "kernels/context.hpp"
#include "kernels/optimizer.hpp"

namespace actorpipe::bench {

std::vector<std::string> corrections_of(Mode mode) {
  if (is_synchronous(mode)) return {};
  if (mode == Mode::xpipe)
    return {"none", "nesterov", "nadam", "rot", "rot+nesterov", "rot32", "rot32+nesterov"};
  return {"none",         "nesterov",    "nadam",           "dc",
          "secant",       "dc+nesterov", "secant+nesterov", "rot",
          "rot+nesterov", "rot32",       "rot32+nesterov"};
}

std::vector<std::string> measured_corrections(Mode mode, std::span<const std::string> only) {
  std::vector<std::string> chosen;
  for (const std::string& c : corrections_of(mode))
    if (only.empty() || c == "none" || std::find(only.begin(), only.end(), c) != only.end())
      chosen.push_back(c);
  return chosen;
}

CorrectionSettings correction_settings(const std::string& name) {
  if (name == "nadam") return {"nesterov", 0.004f, false};
  if (name == "rot") return {"none", 0.0f, true};
  if (name == "rot+nesterov") return {"nesterov", 0.0f, true};
  if (name == "rot32") return {"none", 0.0f, true, 32};
  if (name == "rot32+nesterov") return {"nesterov", 0.0f, true, 32};
  return {name, 0.0f, false};
}

namespace {

OptimizerOptions options_of(const std::string& correction) {
  OptimizerOptions o;
  const CorrectionSettings settings = correction_settings(correction);
  o.delay_correction = settings.delay_correction;
  o.momentum_decay = settings.momentum_decay;
  o.basis_rotation = settings.basis_rotation;
  o.rotation_block = settings.rotation_block;
  o.dc_lambda = 1.0f;
  o.lr = 1e-3f;
  o.weight_decay = 0.1f;
  return o;
}

// The medians of `reps` updates of every layer at steps first, first + stride, ...
double layer_updates_seconds(const Model& model, const OptimizerOptions& o, long first, long stride,
                             int reps, int threads = 1) {
  Context ctx(threads);
  struct Buffers {
    std::vector<float> p, g, older, delta, state;
  };
  std::vector<Buffers> layers;
  for (int i = 0; i < model.num_layers(); ++i) {
    const size_t n = model.layer(i).param_floats();
    Buffers b{std::vector<float>(n, 0.01f), std::vector<float>(n), std::vector<float>(n, 0.0f),
              std::vector<float>(n, 0.0f),
              std::vector<float>(optimizer_state_floats(o, model.layer(i)), 0.0f)};
    for (size_t k = 0; k < n; ++k) b.g[k] = 1e-3f * static_cast<float>((k % 7) + 1);
    std::fill(b.state.begin() + static_cast<std::ptrdiff_t>(n),
              b.state.begin() + static_cast<std::ptrdiff_t>(2 * n), 1e-6f);  // v
    layers.push_back(std::move(b));
  }
  // the eigenvectors of a rotated run exist before its first timed update
  if (o.basis_rotation)
    for (int i = 0; i < model.num_layers(); ++i) {
      Buffers& b = layers[static_cast<size_t>(i)];
      optimizer_update(ctx, o, model.layer(i), b.p.data(), b.g.data(), b.state.data(), 1, 1.0f);
    }
  std::vector<double> times;
  for (int r = 0; r < reps + 1; ++r) {
    const long step = first + r * stride;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < model.num_layers(); ++i) {
      Buffers& b = layers[static_cast<size_t>(i)];
      if (needs_weight_change(o))  // the stage worker's Δ pass: newest minus stale version
        for (size_t k = 0; k < b.p.size(); ++k) b.delta[k] = b.p[k] - b.older[k];
      optimizer_update(ctx, o, model.layer(i), b.p.data(), b.g.data(), b.state.data(), step, 1.0f,
                       needs_weight_change(o) ? b.delta.data() : nullptr);
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (r > 0) times.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  return median(times);
}

}  // namespace

double update_seconds(const Model& model, const std::string& correction, int reps, int threads) {
  const OptimizerOptions o = options_of(correction);
  // steps 12, 13, ... (none refreshes: refreshes fall on 1, 11, 21, ...), skipping those
  AP_CHECK(reps >= 1 && reps <= 8,
           "update_seconds: {} reps (1 to 8: steps 12 to 20 do not refresh)", reps);
  return layer_updates_seconds(model, o, 12, 1, reps, threads);
}

double refreshing_update_seconds(const Model& model, const std::string& correction, int reps) {
  const OptimizerOptions o = options_of(correction);
  return layer_updates_seconds(model, o, 11, o.rotation_every, reps);
}

int run_correction_rows(const BenchShape& shape, std::span<const Mode> modes,
                        const std::vector<int>& counts, int m, int warmup, int reps, int rounds,
                        std::span<const std::string> only, bool as_json,
                        const std::function<void(const std::string&)>& out) {
  int failures = 0;
  auto model = Model::build(shape.model);
  if (!model) {
    out(fmt::format("delay corrections: the {} model: {}\n", shape.name, model.error().message));
    return 1;
  }
  size_t params = 0;
  for (int i = 0; i < model->num_layers(); ++i) params += model->layer(i).param_floats();
  // every correction measured in some mode; the update of each is timed once
  std::vector<std::string> measured;
  for (Mode mode : modes)
    for (const std::string& c : measured_corrections(mode, only))
      if (std::find(measured.begin(), measured.end(), c) == measured.end()) measured.push_back(c);
  // the rotation of a correction's name: rot32+nesterov → rot32
  auto rotation_of = [](const std::string& corr) { return corr.substr(0, corr.find('+')); };
  std::map<std::string, size_t> rotation_floats;  // rot, rot32: the rotation's state
  std::map<std::string, double> refresh_ms;       // an update that refreshes, per rotation
  for (const std::string& corr : measured) {
    const std::string rot = rotation_of(corr);
    if (!correction_settings(corr).basis_rotation || refresh_ms.count(rot)) continue;
    for (int i = 0; i < model->num_layers(); ++i)
      rotation_floats[rot] += optimizer_state_floats(options_of(rot), model->layer(i)) -
                              optimizer_state_floats(OptimizerOptions{}, model->layer(i));
    refresh_ms[rot] = refreshing_update_seconds(*model, rot, 3) * 1e3;
  }
  if (!as_json) {
    std::string refreshes;
    for (const auto& [rot, ms] : refresh_ms)
      refreshes += fmt::format(
          "; one that refreshes {}'s eigenvectors, every 10th, takes {:.2f} ms", rot, ms);
    out(fmt::format(
        "\ndelay corrections (optimizer.delay_correction; rot: optimizer.basis_rotation, rot32: "
        "in blocks of 32), 2 stages x 1 thread, partition {}:{}, {} rounds interleaved (the "
        "order turned round every other round), {} untimed and {} timed steps per run, median "
        "tokens/s; kept: floats per job beside AdamW's m and v (Δ, secant's four arrays in the "
        "optimizer state, the rotation's covariances and eigenvectors); update: one update of "
        "all {} parameters at 1 thread (rot: between refreshes{}), and at 2 threads\n",
        counts[0], counts[1], rounds, warmup, reps, params, refreshes));
    out(fmt::format("  {:<10} {:<16} {:>10} {:>9} {:>12} {:>11} {:>9} {:>11}\n", "mode",
                    "correction", "tokens/s", "x none", "kept floats", "update ms", "x none",
                    "2 threads"));
  }
  std::map<std::string, double> update_ms, update_ms_2;  // at 1 and 2 threads
  for (const std::string& corr : measured) {
    update_ms[corr] = update_seconds(*model, corr, 7) * 1e3;
    update_ms_2[corr] = update_seconds(*model, corr, 7, 2) * 1e3;
  }
  for (Mode mode : modes) {
    const std::vector<std::string> corrections = measured_corrections(mode, only);
    if (corrections.empty()) continue;
    const PipelineRunSpec spec = two_stage_spec(shape, mode, counts, m, warmup, reps);
    std::vector<Variant> variants;
    for (const std::string& corr : corrections)
      variants.push_back({corr, [corr](PipelineRunSpec& s) {
                            const CorrectionSettings settings = correction_settings(corr);
                            s.delay_correction = settings.delay_correction;
                            s.momentum_decay = settings.momentum_decay;
                            s.basis_rotation = settings.basis_rotation;
                            s.rotation_block = settings.rotation_block;
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
      kept[corrections[i]] = r.last.delay_correction_floats * (1 + added) +
                             (correction_settings(corrections[i]).basis_rotation
                                  ? rotation_floats[rotation_of(corrections[i])]
                                  : 0);
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
                         {"basis_rotation", correction_settings(corr).basis_rotation},
                         {"rotation_block", correction_settings(corr).rotation_block},
                         {"refresh_update_ms", correction_settings(corr).basis_rotation
                                                   ? nlohmann::json(refresh_ms[rotation_of(corr)])
                                                   : nlohmann::json(nullptr)},
                         {"stages", 2},
                         {"microbatches", m},
                         {"warmup_steps", warmup},
                         {"partition", counts},
                         {"tokens_per_s", t},
                         {"tokens_per_s_all", tps[corr]},
                         {"kept_floats", kept[corr]},
                         {"update_ms", u},
                         {"update_ms_2_threads", update_ms_2[corr]},
                         {"update_ms_none", u0}};
        j["ratio_to_none"] = has_ratio ? nlohmann::json(ratio) : nlohmann::json(nullptr);
        out(j.dump() + "\n");
      } else {
        out(fmt::format("  {:<10} {:<16} {:>10.1f} {:>9} {:>12} {:>11.2f} {:>8.2f}x {:>11.2f}\n",
                        to_string(mode), corr, t,
                        has_ratio ? fmt::format("{:.3f}x", ratio) : std::string("-"), kept[corr], u,
                        u / u0, update_ms_2[corr]));
      }
    }
  }
  return failures;
}

}  // namespace actorpipe::bench
