// Device discovery: which compute backends this build has and which devices are usable now.
// The CPU backend is always there; CUDA is reported honestly (built or not, GPUs or none, why).
#pragma once

#include <string>

namespace actorpipe {

struct DeviceInfo {
  bool cuda_built = false;  ///< compiled with the CUDA backend (ACTORPIPE_CUDA)
  int cuda_devices = 0;     ///< usable GPUs right now (0 when the driver or devices are missing)
  int cuda_runtime_version = 0;
  int cuda_driver_version = 0;  ///< 0 when no driver is installed
  int nccl_version = 0;         ///< 0 when NCCL is not linked
  std::string status;           ///< one line for logs, e.g. "CUDA: no usable GPU (...)"
};

/// Library: actorpipe::device (kernels/cuda/), which alone loads the CUDA libraries.
/// Probes the backends once (cheap; safe on machines without a GPU or driver: never creates a
/// cuBLAS handle or an NCCL communicator when there is no device).
DeviceInfo probe_devices();

/// On a machine with a usable GPU, runs a small kernel and a cuBLAS sgemm and compares them
/// with the CPU; returns an empty string on success, otherwise what went wrong. Without a GPU
/// (or without the CUDA backend) it returns the reason it cannot run.
std::string cuda_self_test();

}  // namespace actorpipe
