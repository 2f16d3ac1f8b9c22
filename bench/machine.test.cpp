// Machine description tests: the load average and CPU model read from /proc, and the busy
// threshold.
#include "bench/machine.hpp"

#include <doctest/doctest.h>

#include <thread>

using namespace actorpipe::bench;

TEST_CASE("the load average is read from /proc/loadavg") {
  CHECK(load_average() >= 0.0);  // Linux always has /proc/loadavg
}

TEST_CASE("the machine is described by its CPU model and its cores") {
  const std::string cpu = cpu_model();
  CHECK_FALSE(cpu.empty());
  CHECK(cpu.front() != ' ');
  CHECK(describe_machine() ==
        cpu + ", " + std::to_string(std::thread::hardware_concurrency()) + " cores");
}

TEST_CASE("only a load at or above the threshold warns") {
  CHECK_FALSE(warn_if_busy("machine.test", 0.0));
  CHECK_FALSE(warn_if_busy("machine.test", kBusyLoad - 0.01));
  CHECK(warn_if_busy("machine.test", kBusyLoad));
}
