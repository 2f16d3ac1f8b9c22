// Checked devices for the tests of stages off the host: one CheckedBackend per stage (each on a
// Context of its own; the CPU kernels on memory closed to the host between ops), or none for the
// stages that stay on the host; and reading a stage's floats on the host from either.
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "kernels/checked_backend.hpp"
#include "kernels/context.hpp"

namespace actorpipe::testing {

struct CheckedDevices {
  std::vector<std::unique_ptr<Context>> contexts;
  std::vector<std::unique_ptr<CheckedBackend>> backends;
  /// Per stage: its CheckedBackend, or nullptr for a stage in `host`.
  std::vector<ComputeBackend*> pointers;

  explicit CheckedDevices(int stages, const std::vector<int>& host = {}) {
    for (int r = 0; r < stages; ++r) {
      if (std::find(host.begin(), host.end(), r) != host.end()) {
        pointers.push_back(nullptr);
        continue;
      }
      contexts.push_back(std::make_unique<Context>(1));
      backends.push_back(std::make_unique<CheckedBackend>(*contexts.back()));
      pointers.push_back(backends.back().get());
    }
  }
};

/// The floats of `v` (in `memory`) as a host vector.
inline std::vector<float> host_copy(BackendMemory& memory, std::span<const float> v) {
  std::vector<float> staged;
  const std::span<const float> h = host_view(memory, v, staged);
  return {h.begin(), h.end()};
}

}  // namespace actorpipe::testing
