// BackendMemory: the memory half of a compute backend (allocate, release, the copies in and out,
// zeroing) and BackendBuffer, n floats of it owned. ComputeBackend (compute_backend.hpp) is one;
// host_backend_memory() is the process's host memory, which outlives every buffer made from it.
// Buffers that outlive the backend whose ops use them (a stage's scratch handed to the next
// stage in a layer move, a pool of them) are made from a BackendMemory that outlives them: a CPU
// stage's come from host_backend_memory(), whose memory every CPU backend's ops take.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/tensor.hpp"

namespace actorpipe {

/// MemAvailable of /proc/meminfo in bytes, when it can be read.
std::optional<uint64_t> host_available_bytes();

class BackendMemory {
 public:
  virtual ~BackendMemory() = default;
  BackendMemory() = default;
  BackendMemory(const BackendMemory&) = delete;
  BackendMemory& operator=(const BackendMemory&) = delete;

  /// Where the memory lives.
  virtual Device device() const = 0;
  /// Whether host code may read and write the memory directly (and so run the CPU kernels on
  /// it): host memory; not a device's, nor a CheckedBackend's.
  virtual bool host_memory() const { return device() == Device::cpu; }
  /// For messages and logs: "host memory", "cpu (2 threads)", "cuda:0 (NVIDIA H200)".
  virtual std::string name() const = 0;
  /// The physical memory the allocations come from, so that what the stages in one pool hold is
  /// counted together: "host" for the machine's RAM (host memory, a CheckedBackend's pages),
  /// "cuda:0" for a GPU's (every backend on that GPU).
  virtual std::string pool() const { return "host"; }
  /// Bytes the pool can still allocate, when known: for "host" the RAM's MemAvailable
  /// (host_available_bytes), for a GPU its free memory (cudaMemGetInfo).
  virtual std::optional<uint64_t> available_bytes() const { return host_available_bytes(); }

  /// n floats, zero-filled; freed by release(). A CheckFailure naming the size when out of
  /// memory.
  virtual float* allocate(size_t n) = 0;
  virtual void release(float* p) = 0;
  /// dst (this memory, n floats) = src (host); dst (host) = src (this memory); dst = src (both
  /// this memory, overlapping allowed).
  virtual void to_backend(float* dst, const float* src, size_t n) = 0;
  virtual void to_host(float* dst, const float* src, size_t n) = 0;
  virtual void copy(float* dst, const float* src, size_t n) = 0;
  /// dst[0, N) = 0 (this memory).
  virtual void fill_zero(float* dst, long N) = 0;
  /// Waits until every operation issued so far has finished (a no-op on the host).
  virtual void synchronize() = 0;

  /// Memory on the same device that lives until the process ends and that any thread may use:
  /// for tensors that leave a stage (its outputs in flight to the next stage, a channel's
  /// receive buffers), which may outlive the stage's backend. Host memory for host memory (and
  /// by default); a GPU's memory for the CUDA backend; guarded pages for the CheckedBackend.
  virtual BackendMemory& lasting_memory();

  /// dst (this memory) = src (`from`'s memory, another BackendMemory's on the same kind of
  /// device), n floats, complete on return; false where this memory cannot read `from`'s
  /// directly (transfer() then goes through the host). The CUDA backend copies between GPUs.
  virtual bool copy_from(float* dst, BackendMemory& from, const float* src, size_t n) {
    (void)dst, (void)from, (void)src, (void)n;
    return false;
  }
};

/// dst (in `to`) = src (in `from`), n floats, complete on return. `from`'s pending work is
/// waited for first (its synchronize()), so src may be what `from`'s ops just wrote. Host to
/// device and back through to_backend / to_host; between two memories off the host directly
/// where the destination can (copy_from), else through a host buffer.
void transfer(BackendMemory& to, float* dst, BackendMemory& from, const float* src, size_t n);

/// The process's host memory: 64-byte aligned, zero-filled allocations (what the CPU backend
/// allocates), copies by memmove. Lives until the process ends.
BackendMemory& host_backend_memory();

/// The floats of `src` (in `memory`) for the host to read: `src` itself in host memory, else
/// their copy in `staging` (resized to them).
std::span<const float> host_view(BackendMemory& memory, std::span<const float> src,
                                 std::vector<float>& staging);

/// n floats of a BackendMemory, released when it goes (the memory must outlive it).
class BackendBuffer {
 public:
  BackendBuffer() = default;
  BackendBuffer(BackendMemory& memory, size_t n)
      : memory_(&memory), n_(n), p_(memory.allocate(n)) {}
  ~BackendBuffer() { reset(); }
  BackendBuffer(BackendBuffer&& o) noexcept : memory_(o.memory_), n_(o.n_), p_(o.p_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  BackendBuffer& operator=(BackendBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      memory_ = o.memory_;
      n_ = o.n_;
      p_ = o.p_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  float* data() { return p_; }
  const float* data() const { return p_; }
  /// Floats allocated.
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  /// The memory it came from (nullptr for an empty buffer never allocated).
  BackendMemory* memory() const { return memory_; }
  /// Frees the floats now (an empty buffer remains).
  void reset() {
    if (p_ != nullptr) memory_->release(p_);
    p_ = nullptr;
    n_ = 0;
  }

 private:
  BackendMemory* memory_ = nullptr;
  size_t n_ = 0;
  float* p_ = nullptr;
};

}  // namespace actorpipe
