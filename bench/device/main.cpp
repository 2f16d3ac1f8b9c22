// actorpipe-bench-device: see bench/device/device_step.hpp.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "bench/device/device_step.hpp"

int main(int argc, char** argv) {
  using namespace actorpipe::bench;
  const std::vector<std::string> args(argv + 1, argv + argc);
  auto o = parse_device_step_args(args);
  if (!o.ok()) {
    std::fprintf(stderr, "actorpipe-bench-device: %s\n", o.error().message.c_str());
    return 2;
  }
  if (o->help) {
    std::fputs(device_step_usage().c_str(), stdout);
    return 0;
  }
  try {
    auto r = time_device_step(*o);
    if (!r.ok()) {
      std::fprintf(stderr, "actorpipe-bench-device: %s\n", r.error().message.c_str());
      return 2;
    }
    std::fputs(format_device_step(*r, o->json).c_str(), stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "actorpipe-bench-device: %s\n", e.what());
    return 1;
  }
  return 0;
}
