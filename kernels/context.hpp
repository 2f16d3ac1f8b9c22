// Context: the compute budget of one caller (a pipeline stage or the reference trainer):
// its own worker threads, a deterministic static partition of loops, and a scratch arena.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace actorpipe {

class ThreadPool;

/// Grow-only bump allocator for per-step scratch; `reset()` at a step boundary makes the
/// next step reuse the same memory, so a steady-state step performs no allocation.
class Arena {
 public:
  Arena() = default;
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  /// 64-byte aligned, uninitialised.
  float* alloc_f32(size_t n);
  void reset();
  size_t capacity_bytes() const;

 private:
  struct Block;
  Block* head_ = nullptr;  // linked blocks, reused after reset
  Block* cur_ = nullptr;
};

/// A thread budget. Work is split into `threads()` contiguous chunks by a fixed rule, so the
/// same inputs and thread count give the same bits. OpenBLAS itself runs single-threaded;
/// parallel GEMMs are partitioned by the Context, so several Contexts in one process (one
/// per pipeline stage) never oversubscribe the machine.
class Context {
 public:
  explicit Context(int threads = 1);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int threads() const { return threads_; }
  /// Runs fn(chunk, begin, end) for chunk = 0..threads()-1 over [0, n); chunk c covers
  /// [c*n/t, (c+1)*n/t). Blocks until every chunk is done. Chunk 0 runs on the caller.
  void parallel_for(int64_t n, const std::function<void(int chunk, int64_t begin, int64_t end)>& fn);
  Arena& arena() { return arena_; }

 private:
  int threads_;
  std::unique_ptr<ThreadPool> pool_;
  Arena arena_;
};

/// Sets OpenBLAS to one thread for the whole process (called once by every Context ctor).
void pin_blas_single_threaded();

}  // namespace actorpipe
