// The machine a benchmark runs on: its CPU and cores, and how much of it other processes and the
// hypervisor take while a benchmark measures, which says whether the figures can be trusted.
#include "bench/machine.hpp"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

namespace actorpipe::bench {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}

std::string describe_machine() {
  return fmt::format("{}, {} cores", cpu_model(), std::thread::hardware_concurrency());
}

namespace {

double seconds(const timeval& t) {
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
}

double rusage_seconds(int who) {
  rusage u{};
  if (getrusage(who, &u) != 0) return 0.0;
  return seconds(u.ru_utime) + seconds(u.ru_stime);
}

}  // namespace

double process_cpu_seconds() {
  return rusage_seconds(RUSAGE_SELF);
}

CpuSnapshot cpu_snapshot() {
  CpuSnapshot s;
  s.wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  s.self = rusage_seconds(RUSAGE_SELF) + rusage_seconds(RUSAGE_CHILDREN);
  std::ifstream in("/proc/stat");
  std::string line;
  if (!std::getline(in, line) || line.rfind("cpu ", 0) != 0) return s;
  std::istringstream fields(line.substr(4));
  // user nice system idle iowait irq softirq steal (guest time is inside user and nice)
  double v[8] = {};
  for (double& x : v)
    if (!(fields >> x)) return s;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  if (!(tick > 0)) return s;
  s.busy = (v[0] + v[1] + v[2] + v[5] + v[6]) / tick;
  s.steal = v[7] / tick;
  s.ok = true;
  return s;
}

Interference interference(const CpuSnapshot& a, const CpuSnapshot& b) {
  Interference i;
  const double wall = b.wall - a.wall;
  if (!a.ok || !b.ok || !(wall > 0)) return i;
  i.known = true;
  i.self = (b.self - a.self) / wall;
  i.other = std::max(0.0, (b.busy - a.busy) - (b.self - a.self)) / wall;
  i.steal = std::max(0.0, b.steal - a.steal) / wall;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  i.resolution = 2.0 * std::thread::hardware_concurrency() / (tick * wall);
  return i;
}

bool distorted(const Interference& i) {
  return i.known && i.other + i.steal - i.resolution >= kBusyCores;
}

std::string interference_cell(const Interference& i) {
  if (!i.known) return "?";
  return fmt::format("{:.2f}{}", i.other + i.steal, distorted(i) ? " BUSY" : "");
}

void add_interference(nlohmann::ordered_json& j, const Interference& i) {
  j["other_cores"] = i.known ? nlohmann::ordered_json(i.other) : nlohmann::ordered_json();
  j["steal_cores"] = i.known ? nlohmann::ordered_json(i.steal) : nlohmann::ordered_json();
  j["distorted"] = distorted(i);
}

Interference sample_interference(std::chrono::milliseconds window) {
  const CpuSnapshot a = cpu_snapshot();
  std::this_thread::sleep_for(window);
  return interference(a, cpu_snapshot());
}

bool warn_if_busy(const std::string& program, const Interference& i) {
  if (!distorted(i)) return false;
  fmt::print(stderr,
             "{}: warning: other processes and the hypervisor take {:.2f} cores (>= {:.1f}): "
             "they will distort the figures\n",
             program, i.other + i.steal, kBusyCores);
  return true;
}

std::string interference_summary(int distorted_measurements) {
  if (distorted_measurements == 0)
    return fmt::format(
        "quiet: other processes and the hypervisor took less than {:.1f} cores during every "
        "measurement",
        kBusyCores);
  return fmt::format(
      "BUSY: other processes or the hypervisor took {:.1f} cores or more during {} "
      "measurement{} (marked BUSY): those figures are distorted",
      kBusyCores, distorted_measurements, distorted_measurements == 1 ? "" : "s");
}

}  // namespace actorpipe::bench
