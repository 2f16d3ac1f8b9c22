// Machine description tests: the CPU model read from /proc, the CPU time other processes take
// from the machine, and when that distorts a measurement.
#include "bench/machine.hpp"

#include <doctest/doctest.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <thread>

using namespace actorpipe::bench;

TEST_CASE("the machine is described by its CPU model and its cores") {
  const std::string cpu = cpu_model();
  CHECK_FALSE(cpu.empty());
  CHECK(cpu.front() != ' ');
  CHECK(describe_machine() ==
        cpu + ", " + std::to_string(std::thread::hardware_concurrency()) + " cores");
}

TEST_CASE("only distorting interference warns") {
  CHECK_FALSE(warn_if_busy("machine.test", Interference{}));
  CHECK_FALSE(warn_if_busy("machine.test", Interference{true, 0.05, 0.0, 0.0, 0.01}));
  CHECK(warn_if_busy("machine.test", Interference{true, 0.5, 0.0, 0.0, 0.01}));
}

TEST_CASE("a sample spans its window") {
  const Interference i = sample_interference(std::chrono::milliseconds(200));
  REQUIRE(i.known);
  // two ticks per CPU over 200 ms (at 100 ticks per second) and more
  CHECK(i.resolution <= 2.0 * std::thread::hardware_concurrency() / (100.0 * 0.2) + 1e-9);
  CHECK(i.resolution > 0.0);
}

namespace {

// Keeps one core busy for `ms` milliseconds.
void spin_for(int ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  volatile uint64_t x = 0;
  while (std::chrono::steady_clock::now() < until) x = x + 1;
}

}  // namespace

TEST_CASE("a snapshot reads /proc/stat and this process's CPU time") {
  const CpuSnapshot a = cpu_snapshot();
  REQUIRE(a.ok);
  CHECK(a.busy > 0.0);
  CHECK(a.self >= 0.0);
  spin_for(50);
  const CpuSnapshot b = cpu_snapshot();
  CHECK(b.wall > a.wall);
  CHECK(b.self > a.self);
  CHECK(b.busy >= a.busy);
  CHECK_FALSE(interference(b, a).known);  // not later
  CHECK_FALSE(interference(CpuSnapshot{}, b).known);
}

TEST_CASE("this process's own work is not interference, another process's is") {
  // our own thread keeps a core busy: it shows as self, not as other
  CpuSnapshot a = cpu_snapshot();
  spin_for(300);
  Interference mine = interference(a, cpu_snapshot());
  REQUIRE(mine.known);
  // (a machine busy with other tests may give the spinning thread less than its core)
  CHECK(mine.self > 0.3);
  CHECK(mine.self < 1.3);

  // a child we have not waited for yet is another process
  a = cpu_snapshot();
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    spin_for(300);
    _exit(0);
  }
  siginfo_t info{};
  REQUIRE(waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT) == 0);
  const Interference other = interference(a, cpu_snapshot());
  REQUIRE(waitpid(child, nullptr, 0) == child);
  REQUIRE(other.known);
  CHECK(other.other > 0.15);  // the child had (most of) a core for the window
  CHECK(other.self < 0.3);    // we only waited
  CHECK(distorted(other));
  CHECK(other.resolution > 0.0);
  CHECK(other.resolution < 0.2);  // two ticks per CPU over 300 ms and more
  CHECK_FALSE(distorted(Interference{true, 0.02, 0.01, 1.0, 0.0}));
  CHECK(distorted(Interference{true, 0.2, 0.0, 1.0, 0.05}));
  CHECK_FALSE(distorted(Interference{true, 0.2, 0.0, 1.0, 0.5}));  // within the rounding
  CHECK_FALSE(distorted(Interference{false, 5.0, 5.0, 0.0, 0.0}));
}

TEST_CASE("interference is printed as a cell, JSON fields and a summary") {
  CHECK(interference_cell(Interference{}) == "?");
  CHECK(interference_cell(Interference{true, 0.02, 0.01, 1.0, 0.0}) == "0.03");
  CHECK(interference_cell(Interference{true, 0.3, 0.05, 1.0, 0.01}) == "0.35 BUSY");
  nlohmann::ordered_json j;
  add_interference(j, Interference{true, 0.3, 0.05, 1.0, 0.01});
  CHECK(j["other_cores"].get<double>() == 0.3);
  CHECK(j["steal_cores"].get<double>() == 0.05);
  CHECK(j["distorted"].get<bool>());
  add_interference(j, Interference{});
  CHECK(j["other_cores"].is_null());
  CHECK_FALSE(j["distorted"].get<bool>());
  CHECK(interference_summary(0).rfind("quiet: ", 0) == 0);
  CHECK(interference_summary(2).find("during 2 measurements (marked BUSY)") != std::string::npos);
  CHECK(interference_summary(1).find("during 1 measurement (marked BUSY)") != std::string::npos);
}
