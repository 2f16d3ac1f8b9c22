// Step timing: one configuration (shape, threads) of the reference trainer measured in this
// process: median step time, model FLOP/s, peak RSS, the GEMM-only floor and a profile.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_shapes.hpp"
#include "bench/sampling_profiler.hpp"
#include "engine/batch.hpp"
#include "engine/expected.hpp"
#include "kernels/precision.hpp"

namespace actorpipe::bench {

/// What one configuration measures. Times are per step of one microbatch (B, T).
struct StepResult {
  std::string shape;
  int threads = 1;
  std::string precision = "fp32";  // of the matrix products (kernels/precision.hpp)
  int reps = 0;
  int warmup = 0;
  long parameters = 0;              // unique trainable parameters
  double model_flops = 0.0;         // step_model_flops per step
  std::vector<double> step_ms_all;  // every timed step, in order
  double step_ms = 0.0;             // median of step_ms_all
  double tokens_per_s = 0.0;        // B·T / step
  double gflops = 0.0;              // model_flops / step
  double peak_rss_mb = 0.0;         // high-water mark of the steps, before the floor (MiB)
  double first_loss = 0.0;          // loss of the first step (≈ ln V at init)
  // GEMM-only floor: the step's matrix products (sgemm calls, and in bf16 its gemm_bf16 calls)
  // replayed alone on the same threads.
  bool floor_ok = false;
  std::string floor_note;  // why there is no floor
  size_t gemm_calls = 0;
  double gemm_flops = 0.0;   // Σ 2·M·N·K of the step's sgemm calls
  double floor_ms = 0.0;     // median replay time
  double floor_ratio = 0.0;  // step_ms / floor_ms
  std::optional<ProfileReport> profile;
};

/// Builds the model and a ReferenceTrainer at `threads` computing its products in `precision`,
/// runs `warmup` untimed steps, records one step's products, then times `reps` steps, each
/// followed by one timed replay of the recorded products (the floor: step and floor side by side;
/// the replays write copies of the outputs, GemmRecorder::replay, so the steps go on as without
/// them), and with `profile` samples whole steps (at least 0.5 s of them) for the profile.
Expected<StepResult> measure_step(const BenchShape& shape, int threads, Precision precision,
                                  int reps, int warmup, bool profile);

nlohmann::ordered_json to_json(const StepResult& r);
Expected<StepResult> step_result_from_json(const nlohmann::json& j);

/// B sequences of T uniformly random tokens below V drawn from `seed`; each target is the next
/// token (the last one of a sequence a fresh draw).
Microbatch random_microbatch(int V, int B, int T, uint64_t seed);

/// Median of a non-empty list.
double median(std::vector<double> v);

/// `bytes` in MiB.
inline double mib(double bytes) {
  return bytes / (1024.0 * 1024.0);
}

}  // namespace actorpipe::bench
