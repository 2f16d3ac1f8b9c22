// Device discovery: forwards to the CUDA probe when the backend is built, else reports CPU only.
#include "kernels/device.hpp"

#include <fmt/format.h>

#include "kernels/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"

#ifdef ACTORPIPE_WITH_CUDA
#include "kernels/cuda/cuda_probe.h"
#endif

namespace actorpipe {

DeviceInfo probe_devices() {
  DeviceInfo info;
#ifdef ACTORPIPE_WITH_CUDA
  ap_cuda_probe_result r{};
  ap_cuda_probe(&r);
  info.cuda_built = true;
  info.cuda_devices = r.devices;
  info.cuda_runtime_version = r.runtime_version;
  info.cuda_driver_version = r.driver_version;
  info.nccl_version = r.nccl_version;
  if (r.devices > 0) {
    info.status = fmt::format("CUDA: {} GPU(s), runtime {}, driver {}, NCCL {}", r.devices,
                              r.runtime_version, r.driver_version, r.nccl_version);
  } else {
    info.status = fmt::format("CUDA: no usable GPU ({}); computing on the CPU", r.error);
  }
#else
  info.status = "CUDA: backend not built (ACTORPIPE_CUDA=OFF or no nvcc); computing on the CPU";
#endif
  return info;
}

std::string cuda_self_test() {
#ifdef ACTORPIPE_WITH_CUDA
  char msg[256] = {0};
  ap_cuda_self_test(msg, sizeof msg);
  return msg;
#else
  return "the CUDA backend is not built";
#endif
}

#ifndef ACTORPIPE_WITH_CUDA
// Without CUDA in the build the backend cannot be made; the message says so and how to get it.
std::string cuda_unavailable_reason() {
  return "the CUDA backend is not built (ACTORPIPE_CUDA=OFF, or no nvcc when configured)";
}

std::unique_ptr<ComputeBackend> make_cuda_backend(int device_index) {
  AP_CHECK(false, "cuda device {}: {}", device_index, cuda_unavailable_reason());
}
#endif

}  // namespace actorpipe
