// The machine a benchmark runs on: its CPU and cores, and how much of it other processes and the
// hypervisor take while a benchmark measures, which says whether the figures can be trusted.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

namespace actorpipe::bench {

/// The CPU's model name (/proc/cpuinfo); "unknown CPU" when it cannot be read.
std::string cpu_model();

/// "<cpu_model()>, <hardware threads> cores".
std::string describe_machine();

/// The CPU time the machine and this process had used at one moment, in seconds. The load
/// average counts the benchmark's own threads; the difference of two snapshots tells what other
/// work took from the machine meanwhile.
struct CpuSnapshot {
  bool ok = false;     ///< /proc/stat could be read
  double wall = 0.0;   ///< steady clock
  double busy = 0.0;   ///< all CPUs: user, nice, system, irq, softirq (/proc/stat)
  double steal = 0.0;  ///< all CPUs: time the hypervisor ran something else on them
  double self = 0.0;   ///< this process: every thread, plus the children it waited for
};
CpuSnapshot cpu_snapshot();

/// CPU time this process has used so far (every thread, user and system), in seconds.
double process_cpu_seconds();

/// What ran besides this process between two snapshots, in cores on average.
struct Interference {
  bool known = false;  ///< both snapshots read /proc/stat and b is later than a
  double other = 0.0;  ///< other processes (machine busy minus this process's CPU, >= 0)
  double steal = 0.0;  ///< the hypervisor
  double self = 0.0;   ///< this process
  /// /proc/stat counts in clock ticks (10 ms): other and steal may be off by this much (two
  /// ticks per CPU over the interval)
  double resolution = 0.0;
};
Interference interference(const CpuSnapshot& a, const CpuSnapshot& b);

/// Other processes or the hypervisor taking at least this many cores distort a measurement.
inline constexpr double kBusyCores = 0.1;

/// Whether `i` distorts a measurement: known, and other + steal >= kBusyCores even after
/// subtracting the resolution (so a short interval never looks busy by rounding alone).
bool distorted(const Interference& i);

/// A table cell: "0.01" (cores other processes and the hypervisor took), "0.35 BUSY", or "?"
/// when unknown.
std::string interference_cell(const Interference& i);

/// JSON fields other_cores, steal_cores (null when unknown) and distorted, added to `j`.
void add_interference(nlohmann::ordered_json& j, const Interference& i);

/// What ran besides this process during the next `window` (this thread sleeps meanwhile): how
/// busy the machine is before a benchmark starts.
Interference sample_interference(std::chrono::milliseconds window);

/// When `i` is distorted(), warns on standard error that other work distorts the figures, naming
/// `program` ("actorpipe-bench: warning: other processes ..."). Returns whether it warned.
bool warn_if_busy(const std::string& program, const Interference& i);

/// The closing line of a benchmark that counted `distorted_measurements`: "quiet: ..." or
/// "BUSY: ... those figures are distorted".
std::string interference_summary(int distorted_measurements);

}  // namespace actorpipe::bench
