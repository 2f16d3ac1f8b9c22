// The machine a benchmark runs on: its CPU and cores, and how busy it is (the load average),
// which says whether the figures measured on it can be trusted.
#include "bench/machine.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <thread>

namespace actorpipe::bench {

double load_average() {
  std::ifstream in("/proc/loadavg");
  double l = -1.0;
  in >> l;
  return l;
}

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

bool warn_if_busy(const std::string& program, double load) {
  if (load < kBusyLoad) return false;
  fmt::print(stderr,
             "{}: warning: load average {:.2f} (>= {}): other processes are running and will "
             "distort the figures\n",
             program, load, kBusyLoad);
  return true;
}

}  // namespace actorpipe::bench
