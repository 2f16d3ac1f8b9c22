// Context: a persistent pool of sleeping workers running statically partitioned chunks,
// and the grow-only scratch arena.
#include "kernels/context.hpp"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "kernels/check.hpp"
#include "kernels/cpu_backend.hpp"
#include "kernels/gemm.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define AP_CPU_RELAX() _mm_pause()
#else
#define AP_CPU_RELAX() ((void)0)
#endif

namespace actorpipe {

// ---------------------------------------------------------------------------------------
// Arena

namespace {
constexpr size_t kAlign = 64;
constexpr size_t kMinBlock = size_t{1} << 20;
}  // namespace

struct Arena::Block {
  char* data = nullptr;
  size_t size = 0;
  size_t used = 0;
  Block* next = nullptr;

  static Block* make(size_t size) {
    auto* b = new Block;
    b->size = (size + kAlign - 1) / kAlign * kAlign;
    b->data = static_cast<char*>(std::aligned_alloc(kAlign, b->size));
    if (b->data == nullptr) {
      delete b;
      AP_CHECK(false, "arena: out of memory allocating {} bytes", size);
    }
    return b;
  }
};

Arena::~Arena() {
  for (Block* b = head_; b != nullptr;) {
    Block* n = b->next;
    std::free(b->data);
    delete b;
    b = n;
  }
}

float* Arena::alloc_f32(size_t n) {
  const size_t bytes = (n * sizeof(float) + kAlign - 1) / kAlign * kAlign;
  while (true) {
    if (cur_ != nullptr && cur_->size - cur_->used >= bytes) {
      char* p = cur_->data + cur_->used;
      cur_->used += bytes;
      return reinterpret_cast<float*>(p);
    }
    if (cur_ != nullptr && cur_->next != nullptr && cur_->next->size >= bytes) {
      cur_ = cur_->next;
      cur_->used = 0;
      continue;
    }
    // A new block after cur_ (before any later block, which stays for later requests).
    const size_t last = cur_ != nullptr ? cur_->size : 0;
    Block* b = Block::make(std::max({bytes, kMinBlock, 2 * last}));
    if (cur_ == nullptr) {
      b->next = head_;
      head_ = b;
    } else {
      b->next = cur_->next;
      cur_->next = b;
    }
    cur_ = b;
  }
}

void Arena::reset() {
  if (head_ != nullptr && head_->next != nullptr) {
    size_t total = 0;
    for (Block* b = head_; b != nullptr;) {
      total += b->size;
      Block* n = b->next;
      std::free(b->data);
      delete b;
      b = n;
    }
    head_ = Block::make(total);
  }
  if (head_ != nullptr) head_->used = 0;
  cur_ = head_;
}

size_t Arena::capacity_bytes() const {
  size_t total = 0;
  for (const Block* b = head_; b != nullptr; b = b->next) total += b->size;
  return total;
}

// ---------------------------------------------------------------------------------------
// ThreadPool: workers 1..W run chunk w of each job; the caller runs chunk 0.

namespace {
thread_local int tl_in_chunk = 0;  // > 0 while this thread runs a chunk of some pool
constexpr int kSpinIters = 2000;   // a few tens of µs of pause before sleeping

struct InChunk {
  InChunk() { ++tl_in_chunk; }
  ~InChunk() { --tl_in_chunk; }
  InChunk(const InChunk&) = delete;
  InChunk& operator=(const InChunk&) = delete;
};
}  // namespace

class ThreadPool {
 public:
  explicit ThreadPool(int workers) {
    threads_.reserve(static_cast<size_t>(workers));
    for (int w = 1; w <= workers; ++w) threads_.emplace_back([this, w] { worker_loop(w); });
  }

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      gen_.fetch_add(1, std::memory_order_release);
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  /// Runs job(w) for every worker w = 1..W and job(0) on the caller, then waits.
  void run(const ChunkFn& job) {
    job_ = &job;
    error_ = nullptr;
    pending_.store(static_cast<int>(threads_.size()), std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lk(mu_);
      gen_.fetch_add(1, std::memory_order_release);
    }
    work_cv_.notify_all();
    std::exception_ptr mine;
    try {
      job(0, 0, 0);
    } catch (...) {
      mine = std::current_exception();
    }
    for (int i = 0; i < kSpinIters && pending_.load(std::memory_order_acquire) != 0; ++i)
      AP_CPU_RELAX();
    if (pending_.load(std::memory_order_acquire) != 0) {
      std::unique_lock<std::mutex> lk(mu_);
      done_cv_.wait(lk, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    job_ = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void worker_loop(int w) {
    uint64_t seen = 0;
    while (true) {
      uint64_t g = gen_.load(std::memory_order_acquire);
      for (int i = 0; i < kSpinIters && g == seen; ++i) {
        AP_CPU_RELAX();
        g = gen_.load(std::memory_order_acquire);
      }
      if (g == seen) {
        std::unique_lock<std::mutex> lk(mu_);
        work_cv_.wait(lk, [&] { return gen_.load(std::memory_order_acquire) != seen; });
        g = gen_.load(std::memory_order_acquire);
      }
      seen = g;
      if (stop_) return;
      try {
        (*job_)(w, 0, 0);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!error_) error_ = std::current_exception();
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(mu_);
        done_cv_.notify_one();
      }
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> pending_{0};
  const ChunkFn* job_ = nullptr;
  std::exception_ptr error_;
  bool stop_ = false;
};

// ---------------------------------------------------------------------------------------
// Context

int64_t smallest_aligned_chunk(int64_t n, int64_t align, int threads) {
  const int64_t units = (n + align - 1) / align;
  int64_t smallest = n;
  for (int c = 0; c < threads; ++c) {
    const int64_t b = std::min(n, units * c / threads * align);
    const int64_t e = std::min(n, units * (c + 1) / threads * align);
    if (e > b) smallest = std::min(smallest, e - b);
  }
  return smallest;
}

void pin_blas_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

Context::Context(int threads) : threads_(threads) {
  AP_CHECK(threads >= 1 && threads <= 256, "Context threads = {}, allowed 1..256", threads);
  pin_blas_single_threaded();
  // gemm's row alignment is probed here, once per process, so that its products never run
  // while a caller times or records this Context's products
  gemm_row_align();
  if (threads_ > 1) pool_ = std::make_unique<ThreadPool>(threads_ - 1);
  cpu_backend_ = make_cpu_backend(*this);  // made up front: backend() only reads
}

Context::~Context() = default;

ComputeBackend& Context::backend() {
  return backend_ != nullptr ? *backend_ : *cpu_backend_;
}

void Context::set_backend(ComputeBackend* b) {
  if (b != nullptr && b != cpu_backend_.get() && b->precision() != precision_)
    b->set_precision(precision_);
  backend_ = (b != nullptr && cpu_backend_.get() == b) ? nullptr : b;
}

bool Context::host_backend() const {
  return backend_ == nullptr || backend_->host_memory();
}

void Context::set_precision(Precision p) {
  precision_ = p;
  // (a CPU backend made over this very Context reads precision_: it is set already)
  if (backend_ != nullptr && backend_->precision() != p) backend_->set_precision(p);
}

double* Context::reduction_buffer(size_t n) {
  if (reduce_.size() < n) reduce_.resize(n);
  return reduce_.data();
}

void Context::run_chunks(int64_t n, int64_t align, ChunkFn fn) {
  if (n <= 0) return;
  AP_CHECK(align >= 1, "parallel_for_aligned: align = {}, must be >= 1", align);
  const int t = threads_;
  const int64_t units = (n + align - 1) / align;
  auto range = [&](int c, int64_t& b, int64_t& e) {
    b = std::min(n, units * c / t * align);
    e = std::min(n, units * (c + 1) / t * align);
  };
  if (t == 1) {
    InChunk in;
    fn(0, 0, n);
    return;
  }
  auto job = [&](int c, int64_t, int64_t) {
    int64_t b = 0, e = 0;
    range(c, b, e);
    InChunk in;
    fn(c, b, e);
  };
  if (tl_in_chunk > 0) {
    // Nested: the same partition, run in chunk order on this thread.
    for (int c = 0; c < t; ++c) job(c, 0, 0);
    return;
  }
  pool_->run(ChunkFn(job));
}

void Context::run_tasks(int64_t tasks, TaskFn fn) {
  if (tasks <= 0) return;
  if (threads_ == 1 || tasks == 1 || tl_in_chunk > 0) {
    InChunk in;
    for (int64_t i = 0; i < tasks; ++i) fn(0, i);
    return;
  }
  std::atomic<int64_t> next{0};
  auto take = [&](int c, int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < tasks;
         i = next.fetch_add(1, std::memory_order_relaxed))
      fn(c, i);
  };
  run_chunks(threads_, 1, ChunkFn(take));
}

}  // namespace actorpipe
