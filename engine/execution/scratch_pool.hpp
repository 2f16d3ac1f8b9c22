// Scratch pool: float buffers whose contents are dead (an idle stage's activation stash, its
// backward ping-pong and recompute scratch), handed from the stages a layer move retires to
// the stages it builds. Memory the process has touched once is reused, so a move does not fault
// in and clear fresh pages for buffers of the same kind (the bulk of a move's pause on GPT
// small: docs/benchmarks.md).
#pragma once

#include <cstddef>
#include <map>
#include <vector>

namespace actorpipe {

class ScratchPool {
 public:
  /// Keeps `buffer`'s memory (its capacity; its contents are dead). An empty one is dropped.
  void give(std::vector<float> buffer);
  /// `n` zeros in the smallest kept buffer whose capacity holds them (it leaves the pool), or
  /// in a new buffer when none does.
  std::vector<float> take(size_t n);
  /// Bytes of capacity kept now.
  size_t bytes_kept() const { return kept_bytes_; }
  /// Bytes handed out again by take() so far (the reused buffers' capacity).
  size_t bytes_reused() const { return reused_bytes_; }
  /// Bytes take() had to allocate so far.
  size_t bytes_allocated() const { return allocated_bytes_; }

 private:
  std::multimap<size_t, std::vector<float>> kept_;  // by capacity in floats
  size_t kept_bytes_ = 0, reused_bytes_ = 0, allocated_bytes_ = 0;
};

/// `v` = `n` zeros, in a buffer of `pool` when there is one (nullptr: v's own or a new one).
void assign_zeros(std::vector<float>& v, size_t n, ScratchPool* pool);

}  // namespace actorpipe
