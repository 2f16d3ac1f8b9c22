// `actorpipe-bench-device`: a benchmark shape's whole training step (one microbatch forward and
// backward, the clipped AdamW update) on one compute backend, the CPU or a GPU, beside the same
// step's linear-layer products replayed alone (the GEMM-only floor of that backend).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "engine/expected.hpp"

namespace actorpipe::bench {

struct DeviceStepOptions {
  std::string shape = "small";     ///< --shape NAME (bench_shapes(): tiny, small, gpt2)
  std::string precision = "fp32";  ///< --precision fp32 | bf16 (the products)
  std::string backend = "cuda";    ///< --backend cpu | cuda
  int device = 0;                  ///< --device I: the GPU's index (cuda)
  int threads = 1;                 ///< --threads N: the CPU backend's threads
  int reps = 10;                   ///< --reps N timed steps (and floor replays)
  int warmup = 2;                  ///< --warmup N untimed steps first
  bool json = false;               ///< --json: one JSON line instead of the table
  bool profile = false;            ///< --profile: one more step, timed op by op
  bool help = false;
};

/// Parses the arguments after the program name; errors name the option and the value.
Expected<DeviceStepOptions> parse_device_step_args(std::span<const std::string> args);

/// The `--help` text.
std::string device_step_usage();

struct DeviceStepResult {
  std::string shape, backend;  ///< backend: its name(), e.g. "cuda:0 (NVIDIA H200)"
  std::string precision;
  long tokens_per_step = 0;
  double model_flops = 0.0;      ///< step_model_flops of the shape
  double floor_flops = 0.0;      ///< the replayed products' FLOPs
  int products = 0;              ///< linear-layer products per step
  std::vector<double> step_ms;   ///< every timed step, in order
  std::vector<double> floor_ms;  ///< every timed replay, in order
  double first_loss = 0.0, last_loss = 0.0;
  /// --profile: the time of each op name over one step (synchronised op by op), largest first,
  /// and that step's total.
  struct OpTime {
    std::string op;
    int calls = 0;
    double ms = 0.0;
  };
  std::vector<OpTime> profile;
  double profiled_step_ms = 0.0;
  double step_median_ms() const;
  double floor_median_ms() const;
};

/// Builds the shape's GPT on the chosen backend and times it (a CheckFailure naming the reason
/// when the backend cannot be made, e.g. no GPU).
Expected<DeviceStepResult> time_device_step(const DeviceStepOptions& o);

/// The result as the table or the JSON line the program prints.
std::string format_device_step(const DeviceStepResult& r, bool json);

}  // namespace actorpipe::bench
