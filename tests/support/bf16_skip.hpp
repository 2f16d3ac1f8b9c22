// The bf16 tests' skip: a case that needs bf16 products prints "SKIPPED: <reason>" and returns;
// CTest's SKIP_REGULAR_EXPRESSION "SKIPPED: " (every unit-test executable's cases,
// cmake/ActorpipeHelpers.cmake) then reports it skipped, never passed.
#pragma once

#include <iostream>

#include "kernels/bf16_gemm.hpp"

namespace actorpipe::testing {

/// True, with the skip line printed, where oneDNN cannot compute bf16 products here at all (a CPU
/// without AVX-512): the kernels' own bf16 tests, which hold for emulated products as well.
inline bool skip_without_bf16_products() {
  if (bf16_support().products) return false;
  std::cout << "SKIPPED: oneDNN has no bf16 products on this CPU (" << bf16_support().describe()
            << ")\n";
  return true;
}

/// True, with the skip line printed, where pipeline.precision = "bf16" is refused here (no bf16
/// instructions oneDNN runs on): the cases that train or compare runs in bf16.
inline bool skip_without_bf16() {
  if (bf16_support().native) return false;
  std::cout << "SKIPPED: pipeline.precision = \"bf16\" needs bf16 instructions ("
            << bf16_support().describe() << ")\n";
  return true;
}

}  // namespace actorpipe::testing
