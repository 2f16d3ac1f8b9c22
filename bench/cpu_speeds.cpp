#include "bench/cpu_speeds.hpp"

#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <exception>
#include <thread>

namespace actorpipe::bench {

std::vector<CpuSpeed> measure_cpu_speeds() {
  std::vector<CpuSpeed> out;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask)) continue;
    CpuSpeed s;
    s.cpu = cpu;
    // a thread of its own, pinned before it computes (its oneDNN state is its own too)
    std::thread t([&s, cpu] {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      if (const int rc = pthread_setaffinity_np(pthread_self(), sizeof one, &one); rc != 0) {
        s.error = fmt::format("cannot pin a thread to it (error {})", rc);
        return;
      }
      try {
        s.speed = measure_bf16_speed();
      } catch (const std::exception& e) {
        s.error = e.what();
      }
    });
    t.join();
    out.push_back(std::move(s));
  }
  return out;
}

std::string describe_cpu_speeds(const std::vector<CpuSpeed>& s) {
  std::string text;
  for (const CpuSpeed& c : s) {
    if (!text.empty()) text += ", ";
    if (!c.error.empty()) {
      text += fmt::format("cpu{} not measured ({})", c.cpu, c.error);
    } else if (text.empty()) {
      text += fmt::format("cpu{} {:.0f} GFLOP/s (fp32 {:.0f})", c.cpu, c.speed.bf16_gflops,
                          c.speed.fp32_gflops);
    } else {
      text += fmt::format("cpu{} {:.0f} (fp32 {:.0f})", c.cpu, c.speed.bf16_gflops,
                          c.speed.fp32_gflops);
    }
  }
  return text;
}

double bf16_spread(const std::vector<CpuSpeed>& s) {
  double lo = 0.0, hi = 0.0;
  int n = 0;
  for (const CpuSpeed& c : s) {
    if (!c.error.empty() || c.speed.bf16_gflops <= 0.0) continue;
    lo = n == 0 ? c.speed.bf16_gflops : std::min(lo, c.speed.bf16_gflops);
    hi = n == 0 ? c.speed.bf16_gflops : std::max(hi, c.speed.bf16_gflops);
    ++n;
  }
  return n >= 2 ? hi / lo : 1.0;
}

std::string uneven_warning(const std::vector<CpuSpeed>& s) {
  const double spread = bf16_spread(s);
  if (spread < kUnevenSpread) return {};
  return fmt::format(
      "bf16 products run {:.1f}x faster on one CPU than on another: bf16 figures depend on the "
      "CPUs a run gets (pin one with taskset -c)",
      spread);
}

nlohmann::json to_json(const std::vector<CpuSpeed>& s) {
  nlohmann::json a = nlohmann::json::array();
  for (const CpuSpeed& c : s) {
    nlohmann::json j = {
        {"cpu", c.cpu}, {"bf16_gflops", c.speed.bf16_gflops}, {"fp32_gflops", c.speed.fp32_gflops}};
    if (!c.error.empty()) j["error"] = c.error;
    a.push_back(std::move(j));
  }
  return a;
}

}  // namespace actorpipe::bench
