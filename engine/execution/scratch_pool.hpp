// Scratch pool: float buffers whose contents are dead (an idle stage's activation stash, its
// backward ping-pong and recompute scratch), handed from the stages a layer move retires to
// the stages it builds. Memory the process has touched once is reused, so a move does not fault
// in and clear fresh pages for buffers of the same kind (the bulk of a move's pause on GPT
// small: docs/benchmarks.md). The buffers are BackendBuffers: a pool keeps each with the memory
// it came from and hands it out only for that memory.
#pragma once

#include <cstddef>
#include <map>
#include <utility>

#include "kernels/backend_memory.hpp"

namespace actorpipe {

class ScratchPool {
 public:
  /// Keeps `buffer`'s memory (its contents are dead). An empty one is dropped.
  void give(BackendBuffer buffer);
  /// A buffer of `memory` whose first `n` floats are zeros: the smallest kept buffer of that
  /// memory that holds them (it leaves the pool), or a new buffer when none does. n = 0: an
  /// empty buffer.
  BackendBuffer take(BackendMemory& memory, size_t n);
  /// Bytes kept now.
  size_t bytes_kept() const { return kept_bytes_; }
  /// Bytes handed out again by take() so far (the reused buffers' sizes).
  size_t bytes_reused() const { return reused_bytes_; }
  /// Bytes take() had to allocate so far.
  size_t bytes_allocated() const { return allocated_bytes_; }

 private:
  std::multimap<std::pair<const BackendMemory*, size_t>, BackendBuffer> kept_;  // memory, floats
  size_t kept_bytes_ = 0, reused_bytes_ = 0, allocated_bytes_ = 0;
};

/// `b` holds `n` zeros of `memory` first: from `pool` when one is given (b's own buffer is
/// freed), else b's own buffer when it is of `memory` and holds n floats, else a new one.
void assign_zeros(BackendBuffer& b, BackendMemory& memory, size_t n, ScratchPool* pool);

}  // namespace actorpipe
