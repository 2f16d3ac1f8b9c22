// GEMM recorder: captures every sgemm call a training step makes (on each thread of its
// Context, in order) and replays them alone, which times the GEMM-only floor of the step.
#include "bench/gemm_recorder.hpp"

#include <cblas.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "kernels/check.hpp"

namespace actorpipe::bench {

namespace {

using SgemmFn = void (*)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint,
                         blasint, blasint, float, const float*, blasint, const float*, blasint,
                         float, float*, blasint);

std::atomic<GemmRecorder*> g_active{nullptr};

SgemmFn openblas_sgemm() {
  static const SgemmFn fn = reinterpret_cast<SgemmFn>(dlsym(RTLD_NEXT, "cblas_sgemm"));
  return fn;
}

pid_t this_tid() {
  return static_cast<pid_t>(gettid());
}

void call_real(SgemmFn fn, const SgemmCall& c) {
  if (c.is_bf16()) {
    gemm_bf16_serial(c.trans_a, c.trans_b, c.M, c.N, c.K, c.A16, c.lda, c.B16, c.ldb,
                     c.beta != 0.0f, c.C, c.ldc, c.bias);
    return;
  }
  fn(c.row_major ? CblasRowMajor : CblasColMajor, c.trans_a ? CblasTrans : CblasNoTrans,
     c.trans_b ? CblasTrans : CblasNoTrans, c.M, c.N, c.K, c.alpha, c.A, c.lda, c.B, c.ldb, c.beta,
     c.C, c.ldc);
}

// The kernels' bf16 observer: a bf16 product made while a recorder records.
void record_bf16(const Bf16GemmCall& b) {
  if (GemmRecorder* rec = g_active.load(std::memory_order_acquire); rec != nullptr) {
    SgemmCall c;
    c.trans_a = b.trans_a;
    c.trans_b = b.trans_b;
    c.M = b.M;
    c.N = b.N;
    c.K = b.K;
    c.A16 = b.A;
    c.lda = b.lda;
    c.B16 = b.B;
    c.ldb = b.ldb;
    c.beta = b.accumulate ? 1.0f : 0.0f;
    c.C = b.C;
    c.ldc = b.ldc;
    c.bias = b.bias;
    rec->record(c);
  }
}

}  // namespace

bool sgemm_interposed() {
  return openblas_sgemm() != nullptr;
}

void real_sgemm(const SgemmCall& call) {
  const SgemmFn fn = openblas_sgemm();
  AP_CHECK(fn != nullptr, "OpenBLAS's cblas_sgemm was not found behind the recording one");
  call_real(fn, call);
}

GemmRecorder::GemmRecorder(Context& ctx) : ctx_(ctx) {
  const int t = ctx.threads();
  tids_.assign(static_cast<size_t>(t), 0);
  calls_.resize(static_cast<size_t>(t));
  ctx.parallel_for(t, [&](int c, int64_t, int64_t) { tids_[static_cast<size_t>(c)] = this_tid(); });
}

GemmRecorder::~GemmRecorder() {
  if (recording_) stop();
}

void GemmRecorder::start() {
  GemmRecorder* expected = nullptr;
  AP_CHECK(g_active.compare_exchange_strong(expected, this),
           "another GemmRecorder is already recording");
  shadowed_.clear();  // the next replay copies the new calls' outputs
  regions_.clear();
  shadow_bytes_ = 0;
  for (auto& v : calls_) {
    v.clear();
    v.reserve(4096);
  }
  foreign_.store(0);
  recording_ = true;
  set_bf16_gemm_observer(&record_bf16);
}

void GemmRecorder::stop() {
  GemmRecorder* expected = this;
  if (g_active.compare_exchange_strong(expected, nullptr)) set_bf16_gemm_observer(nullptr);
  recording_ = false;
}

size_t GemmRecorder::total_calls() const {
  size_t n = 0;
  for (const auto& v : calls_) n += v.size();
  return n;
}

double GemmRecorder::total_flops() const {
  double f = 0.0;
  for (const auto& v : calls_)
    for (const SgemmCall& c : v) f += c.flops();
  return f;
}

void GemmRecorder::record(const SgemmCall& call) {
  const pid_t tid = this_tid();
  for (size_t c = 0; c < tids_.size(); ++c) {
    if (tids_[c] == tid) {
      calls_[c].push_back(call);  // only thread c appends to calls_[c]
      return;
    }
  }
  // Counted, not stored: a thread outside the Context is not part of the step.
  foreign_.fetch_add(1, std::memory_order_relaxed);
}

namespace {

// Floats from the first to the last element of a rows × cols matrix stored with leading
// dimension ld, row-major or column-major.
size_t extent(bool row_major, int rows, int cols, int ld) {
  if (rows <= 0 || cols <= 0) return 0;
  const auto outer = static_cast<size_t>(row_major ? rows : cols);
  const auto inner = static_cast<size_t>(row_major ? cols : rows);
  return (outer - 1) * static_cast<size_t>(ld) + inner;
}

// bf16 products are row-major
size_t c_extent(const SgemmCall& c) {
  return extent(c.row_major || c.is_bf16(), c.M, c.N, c.ldc);
}
size_t a_extent(const SgemmCall& c) {
  return c.trans_a ? extent(c.row_major, c.K, c.M, c.lda) : extent(c.row_major, c.M, c.K, c.lda);
}
size_t b_extent(const SgemmCall& c) {
  return c.trans_b ? extent(c.row_major, c.N, c.K, c.ldb) : extent(c.row_major, c.K, c.N, c.ldb);
}

}  // namespace

void GemmRecorder::make_shadows() {
  // the regions the calls write, merged where they overlap or touch
  std::vector<Shadow> spans;
  for (const auto& v : calls_) {
    for (const SgemmCall& c : v) {
      const size_t n = c_extent(c);
      if (n == 0) continue;
      const auto b = reinterpret_cast<uintptr_t>(c.C);
      spans.push_back({b, b + n * sizeof(float), nullptr});
    }
  }
  std::sort(spans.begin(), spans.end(),
            [](const Shadow& a, const Shadow& b) { return a.begin < b.begin; });
  regions_.clear();
  for (Shadow& s : spans) {
    if (!regions_.empty() && s.begin <= regions_.back().end)
      regions_.back().end = std::max(regions_.back().end, s.end);
    else
      regions_.push_back(std::move(s));
  }
  // a copy of each region holding the step's values
  shadow_bytes_ = 0;
  for (Shadow& r : regions_) {
    const size_t bytes = r.end - r.begin;
    r.copy = std::make_unique<Storage>(bytes, Device::cpu);
    std::memcpy(r.copy->data(), reinterpret_cast<const void*>(r.begin), bytes);
    shadow_bytes_ += bytes;
  }
  shadowed_ = calls_;
  for (auto& v : shadowed_) {
    for (SgemmCall& c : v) {
      if (c.A != nullptr) c.A = moved(c.A, a_extent(c));
      if (c.B != nullptr) c.B = moved(c.B, b_extent(c));
      if (c.C != nullptr) c.C = const_cast<float*>(moved(c.C, c_extent(c)));
    }
  }
}

const float* GemmRecorder::moved(const float* p, size_t floats) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = std::upper_bound(regions_.begin(), regions_.end(), a,
                             [](uintptr_t x, const Shadow& s) { return x < s.begin; });
  if (it == regions_.begin()) return p;
  --it;
  if (a + floats * sizeof(float) > it->end) return p;
  return reinterpret_cast<const float*>(static_cast<const char*>(it->copy->data()) +
                                        (a - it->begin));
}

const float* GemmRecorder::replayed(const float* p) const {
  return moved(p, 1);
}

double GemmRecorder::replay() {
  AP_CHECK(!recording_, "replay while recording");
  const SgemmFn fn = openblas_sgemm();
  AP_CHECK(fn != nullptr, "OpenBLAS's cblas_sgemm was not found behind the recording one");
  if (shadowed_.empty()) make_shadows();
  const auto t0 = std::chrono::steady_clock::now();
  ctx_.parallel_for(ctx_.threads(), [&](int c, int64_t b, int64_t e) {
    if (b == e) return;
    for (const SgemmCall& call : shadowed_[static_cast<size_t>(c)]) call_real(fn, call);
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace actorpipe::bench

// The program's cblas_sgemm: the kernels' calls land here (the executable's definition
// takes precedence over the shared library's), are recorded when a recorder is active,
// and go on to OpenBLAS.
extern "C" void cblas_sgemm(OPENBLAS_CONST enum CBLAS_ORDER Order,
                            OPENBLAS_CONST enum CBLAS_TRANSPOSE TransA,
                            OPENBLAS_CONST enum CBLAS_TRANSPOSE TransB, OPENBLAS_CONST blasint M,
                            OPENBLAS_CONST blasint N, OPENBLAS_CONST blasint K,
                            OPENBLAS_CONST float alpha, OPENBLAS_CONST float* A,
                            OPENBLAS_CONST blasint lda, OPENBLAS_CONST float* B,
                            OPENBLAS_CONST blasint ldb, OPENBLAS_CONST float beta, float* C,
                            OPENBLAS_CONST blasint ldc) {
  using namespace actorpipe::bench;
  const SgemmFn fn = openblas_sgemm();
  AP_CHECK(fn != nullptr, "OpenBLAS's cblas_sgemm was not found behind the recording one");
  if (GemmRecorder* rec = g_active.load(std::memory_order_acquire); rec != nullptr) {
    SgemmCall c;
    c.row_major = Order == CblasRowMajor;
    c.trans_a = TransA != CblasNoTrans;
    c.trans_b = TransB != CblasNoTrans;
    c.M = M;
    c.N = N;
    c.K = K;
    c.alpha = alpha;
    c.A = A;
    c.lda = lda;
    c.B = B;
    c.ldb = ldb;
    c.beta = beta;
    c.C = C;
    c.ldc = ldc;
    rec->record(c);
  }
  fn(Order, TransA, TransB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
