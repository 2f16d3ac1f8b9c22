// `actorpipe-bench-device`: a shape's step on one compute backend against its GEMM-only floor.
#include "bench/device/device_step.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench/bench_shapes.hpp"
#include "bench/cli_args.hpp"
#include "bench/device/recording_backend.hpp"
#include "engine/data/loader.hpp"
#include "engine/execution/backend_trainer.hpp"
#include "kernels/check.hpp"
#include "kernels/context.hpp"
#include "kernels/cpu_backend.hpp"
#include "kernels/cuda/cuda_backend.hpp"

namespace actorpipe::bench {
namespace {

double median_of(std::vector<double> v) {
  AP_CHECK(!v.empty(), "median of nothing");
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double DeviceStepResult::step_median_ms() const {
  return median_of(step_ms);
}
double DeviceStepResult::floor_median_ms() const {
  return median_of(floor_ms);
}

std::string device_step_usage() {
  return R"(usage: actorpipe-bench-device [options]
  A benchmark shape's training step (one microbatch: forward, backward, clipped AdamW) on one
  compute backend, timed beside the step's linear-layer products replayed alone (its GEMM-only
  floor on that backend).
  --shape NAME     tiny | small | gpt2 (default small)
  --backend NAME   cpu | cuda (default cuda)
  --precision P    fp32 | bf16: what the products compute in (default fp32)
  --device I       the GPU's index (default 0)
  --threads N      the CPU backend's threads (default 1)
  --reps N         timed steps and floor replays (default 10)
  --warmup N       untimed steps first (default 2)
  --json           one JSON line instead of the table
  --profile        one more step, timed op by op (each op synchronised): where the time goes
)";
}

Expected<DeviceStepOptions> parse_device_step_args(std::span<const std::string> args) {
  DeviceStepOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> Expected<std::string> {
      if (i + 1 >= args.size()) return make_error("{} needs a value", a);
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      o.help = true;
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--profile") {
      o.profile = true;
    } else if (a == "--shape") {
      auto v = shape_option(args, i);
      if (!v.ok()) return v.error();
      o.shape = *v;
    } else if (a == "--precision") {
      auto v = value();
      if (!v.ok()) return v.error();
      if (!parse_precision(*v))
        return make_error("--precision {}: unknown precision (allowed: fp32, bf16)", *v);
      o.precision = *v;
    } else if (a == "--backend") {
      auto v = value();
      if (!v.ok()) return v.error();
      if (*v != "cpu" && *v != "cuda")
        return make_error("--backend {}: unknown backend (allowed: cpu, cuda)", *v);
      o.backend = *v;
    } else if (a == "--device" || a == "--threads" || a == "--reps" || a == "--warmup") {
      auto v = value();
      if (!v.ok()) return v.error();
      const int lo = a == "--device" || a == "--warmup" ? 0 : 1;
      auto n = parse_int(a, *v, lo, a == "--threads" ? 256 : 100000);
      if (!n.ok()) return n.error();
      (a == "--device"    ? o.device
       : a == "--threads" ? o.threads
       : a == "--reps"    ? o.reps
                          : o.warmup) = *n;
    } else {
      return make_error("unknown option '{}' (see --help)", a);
    }
  }
  return o;
}

Expected<DeviceStepResult> time_device_step(const DeviceStepOptions& o) {
  auto shape = find_bench_shape(o.shape);
  if (!shape.ok()) return shape.error();
  auto model = Model::build(shape->model);
  if (!model.ok()) return model.error();
  Context cpu_ctx(o.threads);
  std::unique_ptr<ComputeBackend> inner =
      o.backend == "cpu" ? make_cpu_backend(cpu_ctx) : make_cuda_backend(o.device);
  RecordingBackend backend(*inner);

  DeviceStepResult r;
  r.shape = o.shape;
  r.backend = backend.name();
  r.tokens_per_step = shape->tokens_per_step();
  r.model_flops = step_model_flops(*model, shape->B, shape->T);
  OptimizerOptions opt;  // AdamW, clipped at 1.0 (the config's defaults)
  BackendTrainer trainer(*model, opt, shape->B, shape->T, backend);
  trainer.set_precision(*parse_precision(o.precision));
  r.precision = o.precision;
  auto loader =
      DataLoader::open(DataOptions{}, Arch::gpt, shape->model.vocab_size, shape->B, shape->T);
  if (!loader.ok()) return loader.error();
  for (int i = 0; i < o.warmup + o.reps; ++i) {
    const Microbatch mb = (*loader)->next();
    backend.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    const double loss = trainer.step(std::span<const Microbatch>(&mb, 1));
    backend.synchronize();
    const double ms = ms_since(t0);
    if (i == 0) r.first_loss = loss;
    r.last_loss = loss;
    if (i >= o.warmup) r.step_ms.push_back(ms);
  }
  // one more step, untimed, records the products: its scratch no longer grows (a step ran
  // before), so the recorded pointers stay valid for the replays
  const Microbatch mb = (*loader)->next();
  backend.start();
  trainer.step(std::span<const Microbatch>(&mb, 1));
  backend.stop();
  if (o.profile) {
    const Microbatch next = (*loader)->next();
    backend.set_profiling(true);
    const auto t0 = std::chrono::steady_clock::now();
    trainer.step(std::span<const Microbatch>(&next, 1));
    backend.synchronize();
    r.profiled_step_ms = ms_since(t0);
    backend.set_profiling(false);
    for (const auto& t : backend.profile()) r.profile.push_back({t.op, t.calls, t.ms});
    std::sort(r.profile.begin(), r.profile.end(),
              [](const auto& a, const auto& b) { return a.ms > b.ms; });
  }
  r.products = static_cast<int>(backend.calls());
  r.floor_flops = backend.flops();
  for (int i = 0; i < o.reps; ++i) {
    backend.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    backend.replay();
    r.floor_ms.push_back(ms_since(t0));
  }
  return r;
}

std::string format_device_step(const DeviceStepResult& r, bool json) {
  const double step = r.step_median_ms(), floor = r.floor_median_ms();
  const double tok_s = static_cast<double>(r.tokens_per_step) / (step * 1e-3);
  const double gflops = r.model_flops / (step * 1e-3) / 1e9;
  const double floor_gflops = r.floor_flops / (floor * 1e-3) / 1e9;
  if (json) {
    nlohmann::json j = {{"bench", "device_step"},
                        {"shape", r.shape},
                        {"backend", r.backend},
                        {"precision", r.precision},
                        {"reps", r.step_ms.size()},
                        {"step_ms", step},
                        {"step_ms_min", *std::min_element(r.step_ms.begin(), r.step_ms.end())},
                        {"floor_ms", floor},
                        {"step_over_floor", step / floor},
                        {"tokens_per_s", tok_s},
                        {"model_gflops", gflops},
                        {"floor_gflops", floor_gflops},
                        {"products", r.products},
                        {"first_loss", r.first_loss},
                        {"last_loss", r.last_loss}};
    for (const auto& t : r.profile) j["profile"][t.op] = {{"calls", t.calls}, {"ms", t.ms}};
    return j.dump() + "\n";
  }
  std::string s = fmt::format("actorpipe-bench-device: {} on {}, {} ({} timed steps, medians)\n",
                              r.shape, r.backend, r.precision, r.step_ms.size());
  s += fmt::format("{:>10} {:>10} {:>10} {:>12} {:>12} {:>12} {:>9}\n", "step ms", "floor ms",
                   "step/floor", "tokens/s", "model GF/s", "floor GF/s", "products");
  s += fmt::format("{:>10.3f} {:>10.3f} {:>10.2f} {:>12.0f} {:>12.1f} {:>12.1f} {:>9}\n", step,
                   floor, step / floor, tok_s, gflops, floor_gflops, r.products);
  s +=
      fmt::format("loss {:.4f} at the first step, {:.4f} at the last\n", r.first_loss, r.last_loss);
  if (!r.profile.empty()) {
    double sum = 0.0;
    for (const auto& t : r.profile) sum += t.ms;
    s += fmt::format(
        "one more step op by op: {:.3f} ms with a synchronisation per op, {:.3f} ms in the ops\n",
        r.profiled_step_ms, sum);
    for (const auto& t : r.profile)
      s += fmt::format("  {:<30} {:>5} calls {:>9.3f} ms {:>5.1f}%\n", t.op, t.calls, t.ms,
                       100.0 * t.ms / r.profiled_step_ms);
  }
  return s;
}

}  // namespace actorpipe::bench
