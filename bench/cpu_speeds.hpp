// The speed of one product on each CPU this process may run on, one thread pinned to each in
// turn: on a virtual machine the CPUs need not be equal. On the 2-vCPU Xeon with AMX these
// benchmarks ran on, one vCPU's bf16 products ran 2-2.5x slower than the other's while fp32 ran
// alike (its core's AMX unit shared with another tenant, most likely), so a bf16 step's time
// depended on where the process ran. Then all of them at once, which shows CPUs that share one
// core's units (SMT siblings on the host: there a second thread adds little to a product's
// speed). The bench prints both beside its bf16 figures.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/bf16_gemm.hpp"

namespace actorpipe::bench {

struct CpuSpeed {
  int cpu = 0;        ///< the CPU's number (sched_getaffinity's)
  Bf16Speed speed;    ///< measure_bf16_speed() on a thread pinned to it, the others idle
  Bf16Speed shared;   ///< the same while a pinned thread measures on every other CPU too
  std::string error;  ///< why it could not be measured there (then both speeds are zero)
};

/// Every CPU of this process's affinity mask in order, measured one after another (a thread
/// pinned to each: about 30 ms a CPU), then all at once (threads started together). Needs bf16
/// products (bf16_support().products).
std::vector<CpuSpeed> measure_cpu_speeds();

/// "cpu0 310 GFLOP/s (fp32 140), cpu1 720 (fp32 150)"; a CPU that could not be measured says
/// why. With two or more measured: "; all at once cpu0 160 (fp32 75), cpu1 350 (fp32 76)".
std::string describe_cpu_speeds(const std::vector<CpuSpeed>& s);

/// The measured CPUs' bf16 speeds all at once over their speeds each alone, summed: about 1
/// where each has units of its own (also when they differ), about 1/n where n share one core's
/// (1 with fewer than two measured).
double bf16_shared_fraction(const std::vector<CpuSpeed>& s);

/// Empty, or where two or more CPUs keep less than kSharedFraction of their speeds alone when
/// all compute at once: "bf16 products on 2 CPUs at once run at 0.52 of their speeds alone: the
/// CPUs share their units (SMT siblings on the host, most likely), so more threads add little
/// to bf16 figures here".
std::string shared_units_warning(const std::vector<CpuSpeed>& s);
inline constexpr double kSharedFraction = 0.7;

/// The fastest CPU's bf16 products over the slowest's (1 with fewer than two measured).
double bf16_spread(const std::vector<CpuSpeed>& s);

/// Bf16 products this many times faster on one CPU than another make a bf16 figure depend on
/// where it ran.
inline constexpr double kUnevenSpread = 1.5;

/// Empty, or where bf16_spread >= kUnevenSpread: "bf16 products run 2.3x faster on one CPU than
/// on another: bf16 figures depend on the CPUs a run gets (pin one with taskset -c)".
std::string uneven_warning(const std::vector<CpuSpeed>& s);

/// [{"cpu": 0, "bf16_gflops": .., "fp32_gflops": .., "bf16_gflops_shared": ..,
/// "fp32_gflops_shared": ..}, ...]
nlohmann::json to_json(const std::vector<CpuSpeed>& s);

}  // namespace actorpipe::bench
