// Device discovery: the probe never crashes, tells the truth about GPUs, and the self-test
// refuses to claim anything on a machine without one.
#include "kernels/device.hpp"

#include <doctest/doctest.h>

using namespace actorpipe;

TEST_CASE("probe reports the CPU fallback or real GPUs, never both") {
  DeviceInfo info = probe_devices();
  CHECK_FALSE(info.status.empty());
  if (!info.cuda_built) {
    CHECK(info.cuda_devices == 0);
    CHECK(info.status.find("not built") != std::string::npos);
  } else if (info.cuda_devices == 0) {
    CHECK(info.status.find("no usable GPU") != std::string::npos);
    CHECK(info.cuda_runtime_version > 0);  // the runtime library itself is linked and answers
    CHECK(info.nccl_version > 0);          // so is NCCL
  } else {
    CHECK(info.cuda_driver_version > 0);
  }
}

TEST_CASE("CUDA self-test runs on a GPU and explains itself without one") {
  DeviceInfo info = probe_devices();
  std::string result = cuda_self_test();
  if (info.cuda_devices > 0) {
    CHECK_MESSAGE(result.empty(), result);
  } else {
    CHECK_FALSE(result.empty());
  }
}
