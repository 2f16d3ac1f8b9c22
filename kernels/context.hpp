// Context: the compute budget of one caller (a pipeline stage or the reference trainer):
// its own worker threads, a deterministic static partition of loops, tasks taken by whichever
// thread is free, and a scratch arena.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/precision.hpp"

namespace actorpipe {

class ThreadPool;
class Bf16Weights;
class ComputeBackend;

/// Grow-only bump allocator for per-step scratch; `reset()` at a step boundary makes the
/// next step reuse the same memory, so a steady-state step performs no allocation.
/// After a reset that finds more than one block, the blocks are merged into one of their
/// total size, so capacity never grows again for the same sequence of allocations.
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

/// A non-owning reference to a callable `void(int chunk, int64_t begin, int64_t end)`.
class ChunkFn {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, ChunkFn>>>
  ChunkFn(F& f)  // NOLINT: implicit by design
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, int c, int64_t b, int64_t e) { (*static_cast<F*>(o))(c, b, e); }) {}
  void operator()(int c, int64_t b, int64_t e) const { call_(obj_, c, b, e); }

 private:
  void* obj_;
  void (*call_)(void*, int, int64_t, int64_t);
};

/// A non-owning reference to a callable `void(int chunk, int64_t task)`.
class TaskFn {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, TaskFn>>>
  TaskFn(F& f)  // NOLINT: implicit by design
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, int c, int64_t t) { (*static_cast<F*>(o))(c, t); }) {}
  void operator()(int c, int64_t t) const { call_(obj_, c, t); }

 private:
  void* obj_;
  void (*call_)(void*, int, int64_t);
};

/// A thread budget. Work is split into `threads()` contiguous chunks by a fixed rule, or into
/// tasks whose results do not depend on the thread that runs them (parallel_tasks), so the
/// same inputs and thread count give the same bits. OpenBLAS itself runs single-threaded;
/// parallel GEMMs are partitioned by the Context, so several Contexts in one process (one
/// per pipeline stage) never oversubscribe the machine. The workers are created once and
/// sleep on a condition variable between calls (after a spin of a few microseconds).
/// A Context is used by one caller thread at a time.
class Context {
 public:
  explicit Context(int threads = 1);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int threads() const { return threads_; }

  /// What the matrix products of this Context's callers compute in (matmul_*, attention):
  /// fp32 (the default) or bf16 (kernels/bf16_gemm.hpp). Set it before the first call.
  Precision precision() const { return precision_; }
  void set_precision(Precision p);
  /// In bf16: where the linear layers take their weights' bf16 copies (kernels/bf16_weights.hpp),
  /// or null (the default): a copy per product. Owned by the caller.
  Bf16Weights* bf16_weights() const { return bf16_weights_; }
  void set_bf16_weights(Bf16Weights* w) { bf16_weights_ = w; }
  /// In bf16: a layer keeps the activations that only its products read in bf16 (half the
  /// bytes of its saved activations, and no second rounding of them in the backward's weight
  /// gradient; the same bits as keeping them in f32, which false does: the tests' oracle). True
  /// by default; always false in fp32. Set it before the first call: it fixes the layout of
  /// the layers' saved activations (Layer::saved_floats_bf16).
  /// Only on the host: a layer reads such regions with CPU kernels.
  bool bf16_activations() const {
    return precision_ == Precision::bf16 && bf16_activations_ && host_backend();
  }
  void set_bf16_activations(bool on) { bf16_activations_ = on; }

  /// Runs fn(chunk, begin, end) for chunk = 0..threads()-1 over [0, n); chunk c covers
  /// [c*n/t, (c+1)*n/t) (possibly empty). Blocks until every chunk is done. Chunk 0 runs on
  /// the caller. Called from inside a chunk, it runs its chunks one after another on the
  /// calling thread (same partition, same bits). An exception thrown by a chunk is rethrown
  /// here after all chunks have finished. Does nothing when n <= 0.
  template <class F>
  void parallel_for(int64_t n, F&& fn) {
    run_chunks(n, 1, ChunkFn(fn));
  }

  /// Like parallel_for, but every chunk boundary except n is a multiple of `align`: the
  /// chunks cover [c*u/t*align, (c+1)*u/t*align) ∩ [0, n) with u = ceil(n/align).
  template <class F>
  void parallel_for_aligned(int64_t n, int64_t align, F&& fn) {
    run_chunks(n, align, ChunkFn(fn));
  }

  /// Runs fn(chunk, task) for every task in [0, tasks) over the Context's threads, each thread
  /// taking the next task as soon as it is done with one: a faster thread runs more of them
  /// (no thread waits for a slower one while tasks remain). `chunk` is the running thread's
  /// index (0 is the caller), for per-thread scratch; which thread runs a task, and in what
  /// order the tasks run, vary from call to call, so the caller makes every task's result
  /// independent of both. Blocks until every task is done. A task that throws ends its thread's
  /// share (tasks not yet taken may then not run); the exception is rethrown here once every
  /// thread has stopped. Called from inside a chunk, it runs the tasks in order on the calling
  /// thread (chunk 0).
  template <class F>
  void parallel_tasks(int64_t tasks, F&& fn) {
    run_tasks(tasks, TaskFn(fn));
  }

  Arena& arena() { return arena_; }

  /// Where the layers' ops run (kernels/compute_backend.hpp): this Context's own CPU backend (its
  /// threads and arena) unless set_backend chose another. The layers reach every op through it.
  ComputeBackend& backend();
  /// Runs the layers' ops on `b` (not owned; must outlive its use here), or on the Context's own
  /// CPU backend again for nullptr. The backend takes the Context's precision, here and in every
  /// later set_precision.
  void set_backend(ComputeBackend* b);
  /// True when the layers' memory is this process's host memory, which the CPU kernels may
  /// touch (ComputeBackend::host_memory: the CPU backend).
  bool host_backend() const;

  /// A grow-only buffer of at least n doubles for reductions inside one kernel call (kept
  /// by the Context so that a steady-state call does not allocate). Valid until the next
  /// call of this function.
  double* reduction_buffer(size_t n);

 private:
  void run_chunks(int64_t n, int64_t align, ChunkFn fn);
  void run_tasks(int64_t tasks, TaskFn fn);

  int threads_;
  Precision precision_ = Precision::fp32;
  Bf16Weights* bf16_weights_ = nullptr;
  bool bf16_activations_ = true;
  ComputeBackend* backend_ = nullptr;            // set_backend's; null = cpu_backend_
  std::unique_ptr<ComputeBackend> cpu_backend_;  // this Context's own
  std::unique_ptr<ThreadPool> pool_;
  Arena arena_;
  std::vector<double> reduce_;
};

/// The smallest non-empty chunk of [0, n) as Context::parallel_for_aligned(n, align) cuts it for
/// `threads` threads (n itself when n <= align).
int64_t smallest_aligned_chunk(int64_t n, int64_t align, int threads);

/// Sets OpenBLAS to one thread for the whole process (called once by every Context ctor).
void pin_blas_single_threaded();

}  // namespace actorpipe
