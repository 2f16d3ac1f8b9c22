// The machine a benchmark runs on: its CPU and cores, and how busy it is (the load average),
// which says whether the figures measured on it can be trusted.
#pragma once

#include <string>

namespace actorpipe::bench {

/// A 1-minute load average at or above this means other work is running on the machine.
inline constexpr double kBusyLoad = 0.5;

/// The 1-minute load average (/proc/loadavg); -1 when it cannot be read.
double load_average();

/// The CPU's model name (/proc/cpuinfo); "unknown CPU" when it cannot be read.
std::string cpu_model();

/// "<cpu_model()>, <hardware threads> cores".
std::string describe_machine();

/// When `load` >= kBusyLoad, warns on standard error that other processes distort the figures,
/// naming `program` ("actorpipe-bench: warning: load average ..."). Returns whether it warned.
bool warn_if_busy(const std::string& program, double load);

}  // namespace actorpipe::bench
