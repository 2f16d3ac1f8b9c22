// Per-CPU product speeds: the description, the spread and its warning from given figures, and
// one measurement per CPU of this process's mask where the CPU computes bf16 products.
#include "bench/cpu_speeds.hpp"

#include <doctest/doctest.h>
#include <sched.h>

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {
CpuSpeed at(int cpu, double bf16, double fp32, double bf16_shared = 0.0, double fp32_shared = 0.0) {
  CpuSpeed s;
  s.cpu = cpu;
  s.speed.bf16_gflops = bf16;
  s.speed.fp32_gflops = fp32;
  s.shared.bf16_gflops = bf16_shared > 0.0 ? bf16_shared : bf16;
  s.shared.fp32_gflops = fp32_shared > 0.0 ? fp32_shared : fp32;
  return s;
}
}  // namespace

TEST_CASE("per-CPU speeds: described in order, the spread of bf16 and its warning") {
  const std::vector<CpuSpeed> even = {at(0, 700, 150), at(1, 640, 148)};
  CHECK(describe_cpu_speeds(even) ==
        "cpu0 700 GFLOP/s (fp32 150), cpu1 640 (fp32 148); all at "
        "once cpu0 700 (fp32 150), cpu1 640 (fp32 148)");
  CHECK(bf16_spread(even) == doctest::Approx(700.0 / 640.0));
  CHECK(uneven_warning(even).empty());
  const std::vector<CpuSpeed> uneven = {at(0, 300, 150), at(1, 690, 150)};
  CHECK(bf16_spread(uneven) == doctest::Approx(2.3));
  CHECK(uneven_warning(uneven).find("2.3x faster on one CPU") != std::string::npos);
  CHECK(to_json(uneven)[1]["bf16_gflops"] == 690.0);
  // one CPU, or one not measured: no spread
  CHECK(bf16_spread({at(3, 500, 100)}) == 1.0);
  CpuSpeed failed;
  failed.cpu = 1;
  failed.error = "cannot pin a thread to it (error 22)";
  const std::vector<CpuSpeed> one = {at(0, 500, 100), failed};
  CHECK(bf16_spread(one) == 1.0);
  CHECK(describe_cpu_speeds(one) ==
        "cpu0 500 GFLOP/s (fp32 100), cpu1 not measured (cannot pin a thread to it (error 22))");
  CHECK(to_json(one)[1]["error"] == failed.error);
}

TEST_CASE("CPUs that share their units: the fraction kept all at once and its warning") {
  // each its own units, one slower than the other: about all of their speeds alone
  const std::vector<CpuSpeed> own = {at(0, 200, 100, 195, 99), at(1, 700, 100, 698, 98)};
  CHECK(bf16_shared_fraction(own) == doctest::Approx(893.0 / 900.0));
  CHECK(shared_units_warning(own).empty());
  CHECK(to_json(own)[1]["bf16_gflops_shared"] == 698.0);
  // SMT siblings: each at about half its speed
  const std::vector<CpuSpeed> siblings = {at(0, 300, 100, 160, 60), at(1, 290, 100, 150, 58)};
  CHECK(bf16_shared_fraction(siblings) == doctest::Approx(310.0 / 590.0));
  CHECK(shared_units_warning(siblings) ==
        "bf16 products on 2 CPUs at once run at 0.53 of their speeds alone: the CPUs share their "
        "units (SMT siblings on the host, most likely), so more threads add little to bf16 "
        "figures here");
  CHECK(describe_cpu_speeds(siblings) ==
        "cpu0 300 GFLOP/s (fp32 100), cpu1 290 (fp32 100); all "
        "at once cpu0 160 (fp32 60), cpu1 150 (fp32 58)");
  // one CPU: nothing to compare
  CHECK(bf16_shared_fraction({at(2, 300, 100, 100, 50)}) == 1.0);
  CHECK(shared_units_warning({at(2, 300, 100, 100, 50)}).empty());
}

TEST_CASE("measure_cpu_speeds: every CPU of this process's mask, in order") {
  if (!bf16_support().products) {
    MESSAGE("oneDNN has no bf16 products on this CPU: nothing to measure");
    return;
  }
  cpu_set_t mask;
  CPU_ZERO(&mask);
  REQUIRE(sched_getaffinity(0, sizeof mask, &mask) == 0);
  const std::vector<CpuSpeed> s = measure_cpu_speeds();
  REQUIRE(static_cast<int>(s.size()) == CPU_COUNT(&mask));
  for (size_t i = 0; i < s.size(); ++i) {
    CAPTURE(i);
    CHECK(CPU_ISSET(s[i].cpu, &mask));
    if (i > 0) CHECK(s[i].cpu > s[i - 1].cpu);
    CHECK(s[i].error.empty());
    CHECK(s[i].speed.bf16_gflops > 0.0);
    CHECK(s[i].speed.fp32_gflops > 0.0);
    CHECK(s[i].shared.bf16_gflops > 0.0);
    CHECK(s[i].shared.fp32_gflops > 0.0);
  }
}
