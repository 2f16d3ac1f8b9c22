#include "bench/cpu_speeds.hpp"

#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace actorpipe::bench {

namespace {
// A thread pinned to `cpu` that warms up, calls ready() (also when it fails before), then puts
// measure_bf16_speed() into `speed`; an error goes into `error`.
std::thread pinned(int cpu, Bf16Speed& speed, std::string& error,
                   const std::function<void()>& ready) {
  return std::thread([&speed, &error, &ready, cpu] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (const int rc = pthread_setaffinity_np(pthread_self(), sizeof one, &one); rc != 0) {
      error = fmt::format("cannot pin a thread to it (error {})", rc);
      ready();
      return;
    }
    bool started = false;  // ready() called: it counts each thread once
    try {
      (void)measure_bf16_speed();  // its primitives made and its pages touched before the start
      started = true;
      ready();
      speed = measure_bf16_speed();
    } catch (const std::exception& e) {
      error = e.what();
      if (!started) ready();
    }
  });
}
}  // namespace

std::vector<CpuSpeed> measure_cpu_speeds() {
  std::vector<CpuSpeed> out;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return out;
  const std::function<void()> nothing = [] {};
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask)) continue;
    CpuSpeed s;
    s.cpu = cpu;
    // a thread of its own, pinned before it computes (its oneDNN state is its own too)
    pinned(cpu, s.speed, s.error, nothing).join();
    out.push_back(std::move(s));
  }
  // all at once: each thread warms up, then all start together
  std::mutex mu;
  std::condition_variable cv;
  size_t waiting = out.size();
  const std::function<void()> ready = [&] {
    std::unique_lock<std::mutex> lock(mu);
    if (--waiting == 0) {
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return waiting == 0; });
  };
  std::vector<std::string> errors(out.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < out.size(); ++i)
    threads.push_back(pinned(out[i].cpu, out[i].shared, errors[i], ready));
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].error.empty() && !errors[i].empty()) out[i].error = "all at once: " + errors[i];
  return out;
}

std::string describe_cpu_speeds(const std::vector<CpuSpeed>& s) {
  std::string text, shared;
  int measured = 0;
  for (const CpuSpeed& c : s) {
    if (!text.empty()) text += ", ";
    if (!c.error.empty()) {
      text += fmt::format("cpu{} not measured ({})", c.cpu, c.error);
      continue;
    }
    ++measured;
    text += fmt::format("cpu{} {:.0f}{} (fp32 {:.0f})", c.cpu, c.speed.bf16_gflops,
                        measured == 1 ? " GFLOP/s" : "", c.speed.fp32_gflops);
    shared += fmt::format("{}cpu{} {:.0f} (fp32 {:.0f})", shared.empty() ? "" : ", ", c.cpu,
                          c.shared.bf16_gflops, c.shared.fp32_gflops);
  }
  if (measured >= 2) text += "; all at once " + shared;
  return text;
}

double bf16_shared_fraction(const std::vector<CpuSpeed>& s) {
  double alone = 0.0, together = 0.0;
  int n = 0;
  for (const CpuSpeed& c : s) {
    if (!c.error.empty() || c.speed.bf16_gflops <= 0.0) continue;
    alone += c.speed.bf16_gflops;
    together += c.shared.bf16_gflops;
    ++n;
  }
  return n >= 2 ? together / alone : 1.0;
}

std::string shared_units_warning(const std::vector<CpuSpeed>& s) {
  int n = 0;
  for (const CpuSpeed& c : s) n += c.error.empty() && c.speed.bf16_gflops > 0.0 ? 1 : 0;
  const double fraction = bf16_shared_fraction(s);
  if (n < 2 || fraction >= kSharedFraction) return {};
  return fmt::format(
      "bf16 products on {} CPUs at once run at {:.2f} of their speeds alone: the CPUs share "
      "their units (SMT siblings on the host, most likely), so more threads add little to bf16 "
      "figures here",
      n, fraction);
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
    nlohmann::json j = {{"cpu", c.cpu},
                        {"bf16_gflops", c.speed.bf16_gflops},
                        {"fp32_gflops", c.speed.fp32_gflops},
                        {"bf16_gflops_shared", c.shared.bf16_gflops},
                        {"fp32_gflops_shared", c.shared.fp32_gflops}};
    if (!c.error.empty()) j["error"] = c.error;
    a.push_back(std::move(j));
  }
  return a;
}

}  // namespace actorpipe::bench
