// The GPU tests' skip: a case that needs a GPU (or a bf16 CPU for its reference) prints
// "SKIPPED: <reason>" and returns; CTest's SKIP_REGULAR_EXPRESSION "SKIPPED: " then reports it
// skipped, never passed (kernels/cuda/CMakeLists.txt, tests/cuda/CMakeLists.txt).
#pragma once

#include <iostream>
#include <string>

#include "kernels/cuda/cuda_backend.hpp"
#include "tests/support/bf16_skip.hpp"

namespace actorpipe::testing {

/// True, with the skip line printed, when no GPU is usable here (the reason from the backend).
inline bool skip_without_gpu() {
  const std::string why = cuda_unavailable_reason();
  if (why.empty()) return false;
  std::cout << "SKIPPED: " << why << "\n";
  return true;
}

/// The same for a GPU case whose CPU reference computes in bf16: also true without bf16
/// instructions on this CPU.
inline bool skip_without_gpu_or_bf16() {
  return skip_without_gpu() || skip_without_bf16();
}

}  // namespace actorpipe::testing
