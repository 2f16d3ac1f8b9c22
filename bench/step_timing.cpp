// Step timing: one configuration (shape, threads) of the reference trainer measured in this
// process: median step time, model FLOP/s, peak RSS, the GEMM-only floor and a profile.
#include "bench/step_timing.hpp"

#include <fmt/core.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "bench/gemm_recorder.hpp"
#include "engine/batch.hpp"
#include "engine/execution/reference_trainer.hpp"
#include "kernels/check.hpp"

namespace actorpipe::bench {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double peak_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace

Microbatch random_microbatch(int V, int B, int T, uint64_t seed) {
  Microbatch mb;
  mb.B = B;
  mb.T = T;
  const size_t n = static_cast<size_t>(B) * T;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, V - 1);
  std::vector<int32_t> seq(n + static_cast<size_t>(B));
  for (auto& t : seq) t = tok(rng);
  mb.tokens.resize(n);
  mb.targets.resize(n);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const size_t src = static_cast<size_t>(b) * (T + 1) + t;
      mb.tokens[static_cast<size_t>(b) * T + t] = seq[src];
      mb.targets[static_cast<size_t>(b) * T + t] = seq[src + 1];
    }
  return mb;
}

double median(std::vector<double> v) {
  AP_CHECK(!v.empty(), "median of nothing");
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

Expected<StepResult> measure_step(const BenchShape& shape, int threads, Precision precision,
                                  int reps, int warmup, bool profile) {
  if (reps < 1 || warmup < 1)
    return make_error("reps = {}, warmup = {}: both must be at least 1", reps, warmup);
  auto model = Model::build(shape.model);
  if (!model) return model.error();
  StepResult r;
  r.shape = shape.name;
  r.threads = threads;
  r.precision = std::string(to_string(precision));
  r.reps = reps;
  r.warmup = warmup;
  r.parameters = static_cast<long>(model->unique_parameters());
  r.model_flops = step_model_flops(*model, shape.B, shape.T);

  OptimizerOptions opt;  // AdamW, lr 1e-3, betas (0.9, 0.95), eps 1e-8, no decay, clip 1.0
  ReferenceTrainer trainer(std::move(*model), opt, shape.B, shape.T, threads);
  // a bench-only switch: bf16 blocks save their products' inputs in f32, as before they kept
  // them in bf16 (docs/benchmarks.md, "bf16 activations in the stash")
  if (const char* v = std::getenv("ACTORPIPE_BENCH_BF16_ACTIVATIONS"); v != nullptr && *v == '0')
    trainer.context().set_bf16_activations(false);
  trainer.set_precision(precision);
  const std::vector<Microbatch> mbs = {
      random_microbatch(shape.model.vocab_size, shape.B, shape.T, 1234)};
  for (int i = 0; i < warmup; ++i) {
    const double loss = trainer.step(mbs);
    if (i == 0) r.first_loss = loss;
  }
  if (!std::isfinite(r.first_loss))
    return make_error("{}: the first step's loss is {} (not finite)", shape.name, r.first_loss);

  // One step with its sgemm calls recorded (buffers stay put from here on: the trainer
  // allocates nothing in a steady-state step), after the warm-up.
  GemmRecorder recorder(trainer.context());
  if (sgemm_interposed()) {
    recorder.start();
    trainer.step(mbs);
    recorder.stop();
    r.gemm_calls = recorder.total_calls();
    r.gemm_flops = recorder.total_flops();
    if (r.gemm_calls == 0)
      r.floor_note = "no sgemm call was recorded (the kernels' cblas_sgemm is not this program's)";
    else if (recorder.foreign_calls() != 0)
      r.floor_note = fmt::format("{} sgemm calls came from threads outside the Context",
                                 recorder.foreign_calls());
  } else {
    r.floor_note = "OpenBLAS's cblas_sgemm was not found behind the recording one";
  }

  // The timed steps, each followed by one replay of the recorded products when there is a floor:
  // step and floor side by side, so that a slow spell of this machine slows both alike.
  // the steps' high-water mark: before the first replay copies the outputs of the products
  r.peak_rss_mb = peak_rss_mib();
  const bool floor = r.gemm_calls > 0 && r.floor_note.empty();
  if (floor) recorder.replay();  // warm-up (and the copies)
  std::vector<double> replay_ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    trainer.step(mbs);
    r.step_ms_all.push_back(ms_since(t0));
    if (floor) replay_ms.push_back(recorder.replay() * 1000.0);
  }
  r.step_ms = median(r.step_ms_all);
  r.tokens_per_s = static_cast<double>(shape.tokens_per_step()) / (r.step_ms / 1000.0);
  r.gflops = r.model_flops / (r.step_ms / 1000.0) / 1e9;
  if (floor) {
    r.floor_ms = median(replay_ms);
    r.floor_ratio = r.step_ms / r.floor_ms;
    r.floor_ok = true;
  }

  if (profile) {
    // Whole steps, at least 0.5 s of them, sampled every millisecond on each of the
    // Context's threads (room for twice the expected samples: drops are counted anyway).
    const int steps = std::clamp(static_cast<int>(std::ceil(500.0 / r.step_ms)), 1, 50);
    const auto period = std::chrono::microseconds(1000);
    const auto per_thread = static_cast<size_t>(2.0 * steps * r.step_ms) + 1000;
    SamplingProfiler prof(per_thread * static_cast<size_t>(threads));
    Symbolizer sym;
    // The Context's threads only, chunk 0 (the caller) first.
    std::vector<pid_t> tids(static_cast<size_t>(threads));
    trainer.context().parallel_for(threads, [&](int c, int64_t, int64_t) {
      tids[static_cast<size_t>(c)] = static_cast<pid_t>(gettid());
    });
    if (prof.start(period, tids)) {
      const auto t0 = Clock::now();
      for (int i = 0; i < steps; ++i) trainer.step(mbs);
      const double wall = ms_since(t0);
      prof.stop();
      r.profile = summarize_profile(prof, sym, steps, wall, period);
    } else {
      fmt::print(stderr, "actorpipe-bench: no profile: POSIX timers were refused\n");
    }
  }

  return r;
}

nlohmann::ordered_json to_json(const StepResult& r) {
  nlohmann::ordered_json j = {
      {"shape", r.shape},
      {"threads", r.threads},
      {"precision", r.precision},
      {"reps", r.reps},
      {"warmup", r.warmup},
      {"parameters", r.parameters},
      {"model_flops", r.model_flops},
      {"step_ms_all", r.step_ms_all},
      {"step_ms", r.step_ms},
      {"tokens_per_s", r.tokens_per_s},
      {"gflops", r.gflops},
      {"peak_rss_mb", r.peak_rss_mb},
      {"first_loss", r.first_loss},
      {"floor_ok", r.floor_ok},
      {"floor_note", r.floor_note},
      {"gemm_calls", r.gemm_calls},
      {"gemm_flops", r.gemm_flops},
      {"floor_ms", r.floor_ms},
      {"floor_ratio", r.floor_ratio},
  };
  if (r.profile) {
    const ProfileReport& p = *r.profile;
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const auto& row : p.rows)
      rows.push_back({{"category", std::string(to_string(row.category))},
                      {"caller_ms", row.caller_ms},
                      {"workers_ms", row.workers_ms}});
    nlohmann::ordered_json hot = nlohmann::ordered_json::array();
    for (const auto& h : p.hottest)
      hot.push_back({{"name", h.name},
                     {"where", h.where},
                     {"category", std::string(to_string(h.category))},
                     {"share", h.share}});
    j["profile"] = {{"steps", p.steps},     {"step_ms", p.step_ms}, {"period_ms", p.period_ms},
                    {"samples", p.samples}, {"dropped", p.dropped}, {"workers", p.workers},
                    {"rows", rows},         {"hottest", hot}};
  }
  return j;
}

Expected<StepResult> step_result_from_json(const nlohmann::json& j) {
  try {
    StepResult r;
    r.shape = j.at("shape").get<std::string>();
    r.threads = j.at("threads").get<int>();
    r.precision = j.value("precision", std::string("fp32"));
    r.reps = j.at("reps").get<int>();
    r.warmup = j.at("warmup").get<int>();
    r.parameters = j.at("parameters").get<long>();
    r.model_flops = j.at("model_flops").get<double>();
    r.step_ms_all = j.at("step_ms_all").get<std::vector<double>>();
    r.step_ms = j.at("step_ms").get<double>();
    r.tokens_per_s = j.at("tokens_per_s").get<double>();
    r.gflops = j.at("gflops").get<double>();
    r.peak_rss_mb = j.at("peak_rss_mb").get<double>();
    r.first_loss = j.at("first_loss").get<double>();
    r.floor_ok = j.at("floor_ok").get<bool>();
    r.floor_note = j.at("floor_note").get<std::string>();
    r.gemm_calls = j.at("gemm_calls").get<size_t>();
    r.gemm_flops = j.at("gemm_flops").get<double>();
    r.floor_ms = j.at("floor_ms").get<double>();
    r.floor_ratio = j.at("floor_ratio").get<double>();
    if (j.contains("profile")) {
      const nlohmann::json& p = j.at("profile");
      ProfileReport rep;
      rep.steps = p.at("steps").get<int>();
      rep.step_ms = p.at("step_ms").get<double>();
      rep.period_ms = p.at("period_ms").get<double>();
      rep.samples = p.at("samples").get<size_t>();
      rep.dropped = p.at("dropped").get<size_t>();
      rep.workers = p.at("workers").get<int>();
      for (const auto& row : p.at("rows")) {
        ProfileReport::Row x;
        const auto name = row.at("category").get<std::string>();
        if (!category_from_string(name, x.category))
          return make_error("measurement JSON: unknown profile category '{}'", name);
        x.caller_ms = row.at("caller_ms").get<double>();
        x.workers_ms = row.at("workers_ms").get<double>();
        rep.rows.push_back(x);
      }
      for (const auto& h : p.at("hottest")) {
        ProfileReport::Hot x;
        x.name = h.at("name").get<std::string>();
        x.where = h.at("where").get<std::string>();
        const auto name = h.at("category").get<std::string>();
        if (!category_from_string(name, x.category))
          return make_error("measurement JSON: unknown profile category '{}'", name);
        x.share = h.at("share").get<double>();
        rep.hottest.push_back(x);
      }
      r.profile = rep;
    }
    return r;
  } catch (const nlohmann::json::exception& e) {
    return make_error("measurement JSON: {} (in {})", e.what(), j.dump().substr(0, 200));
  }
}

}  // namespace actorpipe::bench
