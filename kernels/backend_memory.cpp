// The process's host memory (host_backend_memory) and what the host's RAM has left.
#include "kernels/backend_memory.hpp"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "kernels/check.hpp"

namespace actorpipe {
namespace {

// n zeros in 64-byte aligned memory, freed by std::free
float* allocate_host_floats(size_t n) {
  const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
  AP_CHECK(p != nullptr, "host memory: out of memory allocating {} floats", n);
  std::memset(p, 0, bytes == 0 ? 64 : bytes);
  return static_cast<float*>(p);
}

class HostMemory final : public BackendMemory {
 public:
  Device device() const override { return Device::cpu; }
  std::string name() const override { return "host memory"; }
  float* allocate(size_t n) override { return allocate_host_floats(n); }
  void release(float* p) override { std::free(p); }
  void to_backend(float* dst, const float* src, size_t n) override { copy(dst, src, n); }
  void to_host(float* dst, const float* src, size_t n) override { copy(dst, src, n); }
  void copy(float* dst, const float* src, size_t n) override {
    if (n > 0 && dst != src) std::memmove(dst, src, n * sizeof(float));
  }
  void fill_zero(float* dst, long N) override {
    if (N > 0) std::memset(dst, 0, static_cast<size_t>(N) * sizeof(float));
  }
  void synchronize() override {}
};

}  // namespace

std::optional<uint64_t> host_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    uint64_t kib = 0;
    if (in >> kib) return kib * 1024;
  }
  return std::nullopt;
}

std::span<const float> host_view(BackendMemory& memory, std::span<const float> src,
                                 std::vector<float>& staging) {
  if (memory.host_memory()) return src;
  staging.resize(src.size());
  memory.to_host(staging.data(), src.data(), src.size());
  return staging;
}

BackendMemory& BackendMemory::lasting_memory() {
  return host_backend_memory();
}

void transfer(BackendMemory& to, float* dst, BackendMemory& from, const float* src, size_t n) {
  if (n == 0) return;
  from.synchronize();
  if (from.host_memory()) {
    to.to_backend(dst, src, n);
  } else if (to.host_memory()) {
    from.to_host(dst, src, n);
  } else if (&to == &from) {
    to.copy(dst, src, n);
    to.synchronize();
  } else if (!to.copy_from(dst, from, src, n)) {
    std::vector<float> bounce(n);
    from.to_host(bounce.data(), src, n);
    to.to_backend(dst, bounce.data(), n);
  }
}

BackendMemory& host_backend_memory() {
  static HostMemory* memory = new HostMemory();  // never destroyed: buffers may outlive statics
  return *memory;
}

}  // namespace actorpipe
