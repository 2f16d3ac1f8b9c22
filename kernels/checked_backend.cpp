// CheckedBackend: the CPU kernels on memory of the backend's own, with every op's arguments
// checked against it and the memory closed (PROT_NONE) between ops.
#include "kernels/checked_backend.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "kernels/check.hpp"
#include "kernels/cpu_backend.hpp"

namespace actorpipe {

namespace {

std::atomic<int> g_guarding{0};  // guarded CheckedBackends alive
struct sigaction g_previous_segv {};

// SIGSEGV while some CheckedBackend guards its memory: say what the likely cause is, then let
// the previous handler (the default, or a sanitizer's) take the fault as it comes again.
void on_segv(int sig, siginfo_t* info, void* /*context*/) {
  if (g_guarding.load() == 0) {
    ::sigaction(sig, &g_previous_segv, nullptr);
    return;
  }
  char text[160] = "actorpipe: SIGSEGV at 0x";
  size_t len = std::strlen(text);
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (int shift = 60; shift >= 0; shift -= 4)
    text[len++] = "0123456789abcdef"[(addr >> shift) & 0xF];
  const char* tail =
      ": a CheckedBackend closes its memory between ops; host code that reads or writes backend "
      "memory directly (not through to_host or to_backend) faults here\n";
  (void)!::write(STDERR_FILENO, text, len);
  (void)!::write(STDERR_FILENO, tail, std::strlen(tail));
  ::sigaction(sig, &g_previous_segv, nullptr);
}

// Installs on_segv unless it is the handler already (someone may have replaced it since: a test
// framework's own handler, say), keeping the one it replaces.
void install_segv_note() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  struct sigaction current {};
  ::sigaction(SIGSEGV, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) != 0 && current.sa_sigaction == on_segv) return;
  struct sigaction sa {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGSEGV, &sa, &g_previous_segv);
}

size_t page_size() {
  static const size_t size = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

template <class T>
int32_t max_index(const T* v, long n) {
  int32_t m = -1;
  for (long i = 0; i < n; ++i) m = std::max<int32_t>(m, static_cast<int32_t>(v[i]));
  return m;
}

// The CheckedBackends' lasting memory: pages closed (PROT_NONE) except while one of its own
// transfers copies in or out of them, so host code that reads a stage's output directly faults
// as it would on a device. Any thread; lives until the process ends.
class GuardedPages final : public BackendMemory {
 public:
  GuardedPages() {
    g_guarding.fetch_add(1);  // for good: the note explains a fault in these pages too
    install_segv_note();
  }
  Device device() const override { return Device::cpu; }
  bool host_memory() const override { return false; }
  std::string name() const override { return "checked device memory"; }
  BackendMemory& lasting_memory() override { return *this; }

  float* allocate(size_t n) override {
    const size_t bytes = n * sizeof(float);
    const size_t mapped =
        std::max<size_t>((bytes + page_size() - 1) / page_size(), 1) * page_size();
    void* p = ::mmap(nullptr, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    AP_CHECK(p != MAP_FAILED, "checked device memory: out of memory allocating {} floats: {}", n,
             std::strerror(errno));
    std::lock_guard<std::mutex> lock(mu_);
    regions_[static_cast<char*>(p)] = Extent{bytes, mapped};
    return static_cast<float*>(p);  // anonymous memory is zero-filled
  }
  void release(float* p) override {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(reinterpret_cast<char*>(p));
    AP_CHECK(it != regions_.end(), "checked device memory: release of {}, which is no allocation",
             static_cast<const void*>(p));
    ::munmap(it->first, it->second.mapped);
    regions_.erase(it);
  }
  void to_backend(float* dst, const float* src, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    Open open(region(dst, n, "to_backend: dst"));
    std::copy(src, src + n, dst);
  }
  void to_host(float* dst, const float* src, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    Open open(region(src, n, "to_host: src"));
    std::copy(src, src + n, dst);
  }
  void copy(float* dst, const float* src, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    Open a(region(src, n, "copy: src"));
    std::vector<float> tmp(src, src + n);
    Open b(region(dst, n, "copy: dst"));  // the same region again is fine: both close it
    std::copy(tmp.begin(), tmp.end(), dst);
  }
  void fill_zero(float* dst, long N) override {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t n = static_cast<size_t>(std::max(N, 0L));
    Open open(region(dst, n, "fill_zero: dst"));
    std::fill(dst, dst + n, 0.0f);
  }
  void synchronize() override {}

 private:
  struct Extent {
    size_t bytes = 0, mapped = 0;
  };
  using Regions = std::map<char*, Extent>;
  // the region that holds [p, p + n floats); AP_CHECK otherwise
  Regions::iterator region(const float* p, size_t n, const char* what) {
    const char* c = reinterpret_cast<const char*>(p);
    auto it = regions_.upper_bound(const_cast<char*>(c));
    AP_CHECK(it != regions_.begin() && c >= std::prev(it)->first &&
                 c + n * sizeof(float) <= std::prev(it)->first + std::prev(it)->second.bytes,
             "checked device memory: {} ({} floats at {}) is not its memory", what, n,
             static_cast<const void*>(p));
    return std::prev(it);
  }
  struct Open {
    explicit Open(Regions::iterator r) : r_(r) { set(PROT_READ | PROT_WRITE); }
    ~Open() { set(PROT_NONE); }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;
    void set(int prot) {
      AP_CHECK(::mprotect(r_->first, r_->second.mapped, prot) == 0,
               "checked device memory: mprotect failed: {}", std::strerror(errno));
    }
    Regions::iterator r_;
  };
  std::mutex mu_;
  Regions regions_;
};

}  // namespace

// One op: its arguments checked on construction (dev, host), the backend's memory open while
// run() runs.
class CheckedBackend::Op {
 public:
  Op(CheckedBackend& b, const char* name) : lock_(b.shared_->mu), b_(b), name_(name) { ++b_.ops_; }

  /// `p` (null allowed) and the `floats` after it lie in one region of the backend's memory.
  Op& dev(const void* p, size_t floats, const char* arg) {
    if (p == nullptr) return *this;
    const size_t bytes = floats * sizeof(float);
    const char* c = static_cast<const char*>(p);
    auto it = b_.regions_.upper_bound(c);
    bool inside = false;
    if (it != b_.regions_.begin()) {
      --it;
      inside = c >= it->first && c + bytes <= it->first + it->second.bytes;
    }
    AP_CHECK(inside, "CheckedBackend: {}: {} ({} floats at {}) is not the backend's memory{}",
             name_, arg, floats, p,
             b_.owns(p) ? " (it starts in an allocation but runs past its end)"
                        : " (host memory, or memory released)");
    return *this;
  }
  /// `p` (null allowed) and the `bytes` after it lie outside the backend's memory.
  Op& host(const void* p, size_t bytes, const char* arg) {
    if (p == nullptr) return *this;
    const char* c = static_cast<const char*>(p);
    auto it = b_.regions_.lower_bound(c + bytes);
    bool overlaps = false;
    if (it != b_.regions_.begin()) {
      --it;
      overlaps = c < it->first + it->second.bytes && it->first < c + bytes;
    }
    AP_CHECK(!overlaps,
             "CheckedBackend: {}: {} ({} bytes at {}) is backend memory; it must be host memory",
             name_, arg, bytes, p);
    return *this;
  }
  /// The embeddings' host index arrays (tokens; segments, null allowed) and their tables in
  /// the backend's memory: token and segment tables as many rows of C as the largest index
  /// names, the position table T rows.
  Op& embedding(const int32_t* tokens, const int32_t* segments, std::array<const float*, 3> tables,
                std::array<const char*, 3> names, int B, int T, int C) {
    const long BT = 1L * B * T;
    host(tokens, static_cast<size_t>(std::max(BT, 0L)) * sizeof(int32_t), "tokens");
    host(segments, static_cast<size_t>(std::max(BT, 0L)) * sizeof(int32_t), "segments");
    dev(tables[0], static_cast<size_t>((max_index(tokens, BT) + 1L) * C), names[0]);
    dev(tables[1], static_cast<size_t>(std::max(1L * T * C, 0L)), names[1]);
    if (segments != nullptr)
      dev(tables[2], static_cast<size_t>((max_index(segments, BT) + 1L) * C), names[2]);
    return *this;
  }
  template <class F>
  auto run(F&& f) {
    struct Open {
      CheckedBackend& b;
      explicit Open(CheckedBackend& x) : b(x) { b.protect(PROT_READ | PROT_WRITE); }
      ~Open() { b.protect(PROT_NONE); }
      Open(const Open&) = delete;
      Open& operator=(const Open&) = delete;
    } open(b_);
    return f();
  }

 private:
  std::unique_lock<std::recursive_mutex> lock_;  // the whole op, with its companions'
  CheckedBackend& b_;
  const char* name_;
};

CheckedBackend::CheckedBackend(Context& ctx, bool guard)
    : CheckedBackend(ctx, guard, std::make_shared<Shared>()) {}

CheckedBackend::CheckedBackend(Context& ctx, bool guard, std::shared_ptr<Shared> shared)
    : cpu_(make_cpu_backend(ctx)),
      guard_(guard),
      shared_(std::move(shared)),
      regions_(shared_->regions) {
  if (guard_) {
    install_segv_note();
    g_guarding.fetch_add(1);
  }
}

std::unique_ptr<ComputeBackend> CheckedBackend::companion(Context& ctx) {
  return std::unique_ptr<ComputeBackend>(new CheckedBackend(ctx, guard_, shared_));
}

CheckedBackend::~CheckedBackend() {
  {
    std::lock_guard<std::recursive_mutex> lock(shared_->mu);
    reset_scratch();  // its own scratch; the allocations go with the last backend sharing them
  }
  if (guard_) g_guarding.fetch_sub(1);
}

CheckedBackend::Shared::~Shared() {
  for (const auto& [base, r] : regions) ::munmap(const_cast<char*>(base), r.mapped);
}

size_t CheckedBackend::regions() const {
  std::lock_guard<std::recursive_mutex> lock(shared_->mu);
  return regions_.size();
}

long CheckedBackend::ops() const {
  std::lock_guard<std::recursive_mutex> lock(shared_->mu);
  return ops_;
}

bool CheckedBackend::owns(const void* p) const {
  std::lock_guard<std::recursive_mutex> lock(shared_->mu);
  const char* c = static_cast<const char*>(p);
  auto it = regions_.upper_bound(c);
  if (it == regions_.begin()) return false;
  --it;
  return c >= it->first && c < it->first + std::max<size_t>(it->second.bytes, 1);
}

std::string CheckedBackend::name() const {
  return fmt::format("checked {}{}", cpu_->name(), guard_ ? ", guarded" : "");
}

Precision CheckedBackend::precision() const {
  return cpu_->precision();
}

void CheckedBackend::set_precision(Precision p) {
  cpu_->set_precision(p);
}

float* CheckedBackend::map(size_t n, bool scratch) {
  std::lock_guard<std::recursive_mutex> lock(shared_->mu);
  const size_t bytes = n * sizeof(float);
  const size_t mapped = std::max<size_t>((bytes + page_size() - 1) / page_size(), 1) * page_size();
  void* p = ::mmap(nullptr, mapped, guard_ ? PROT_NONE : PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  AP_CHECK(p != MAP_FAILED, "CheckedBackend: out of memory allocating {} floats: {}", n,
           std::strerror(errno));
  regions_[static_cast<const char*>(p)] = Region{bytes, mapped, scratch ? this : nullptr};
  return static_cast<float*>(p);  // anonymous memory is zero-filled
}

void CheckedBackend::unmap(std::map<const char*, Region>::iterator it) {
  ::munmap(const_cast<char*>(it->first), it->second.mapped);
  regions_.erase(it);
}

void CheckedBackend::protect(int prot) {
  if (!guard_) return;
  for (const auto& [base, r] : regions_) {
    AP_CHECK(::mprotect(const_cast<char*>(base), r.mapped, prot) == 0,
             "CheckedBackend: mprotect of {} bytes failed: {}", r.mapped, std::strerror(errno));
  }
}

BackendMemory& CheckedBackend::lasting_memory() {
  static GuardedPages* pages = new GuardedPages();  // never destroyed: tensors may outlive statics
  return *pages;
}

float* CheckedBackend::allocate(size_t n) {
  return map(n, false);
}

void CheckedBackend::release(float* p) {
  if (p == nullptr) return;
  std::lock_guard<std::recursive_mutex> lock(shared_->mu);
  auto it = regions_.find(reinterpret_cast<const char*>(p));
  AP_CHECK(it != regions_.end() && it->second.scratch_of == nullptr,
           "CheckedBackend: release of {}, which is no allocation of this backend",
           static_cast<const void*>(p));
  unmap(it);
}

float* CheckedBackend::scratch(size_t n) {
  return map(n, true);
}

void CheckedBackend::reset_scratch() {
  std::lock_guard<std::recursive_mutex> lock(shared_->mu);
  for (auto it = regions_.begin(); it != regions_.end();) {
    auto next = std::next(it);
    if (it->second.scratch_of == this) unmap(it);
    it = next;
  }
}

void CheckedBackend::to_backend(float* dst, const float* src, size_t n) {
  Op op(*this, "to_backend");
  op.dev(dst, n, "dst").host(src, n * sizeof(float), "src");
  op.run([&] { std::copy(src, src + n, dst); });
}

void CheckedBackend::to_host(float* dst, const float* src, size_t n) {
  Op op(*this, "to_host");
  op.host(dst, n * sizeof(float), "dst").dev(src, n, "src");
  op.run([&] { std::copy(src, src + n, dst); });
}

void CheckedBackend::copy(float* dst, const float* src, size_t n) {
  Op op(*this, "copy");
  op.dev(dst, n, "dst").dev(src, n, "src");
  op.run([&] { std::copy(src, src + n, dst); });
}

namespace {
size_t z(long v) {
  return static_cast<size_t>(std::max(v, 0L));
}
}  // namespace

void CheckedBackend::matmul_forward(float* out, const float* inp, const float* weight,
                                    const float* bias, int N, int C, int OC) {
  Op op(*this, "matmul_forward");
  op.dev(out, z(1L * N * OC), "out").dev(inp, z(1L * N * C), "inp");
  op.dev(weight, z(1L * OC * C), "weight").dev(bias, z(OC), "bias");
  op.run([&] { cpu_->matmul_forward(out, inp, weight, bias, N, C, OC); });
}

void CheckedBackend::matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                     const float* inp, const float* weight, int N, int C, int OC) {
  Op op(*this, "matmul_backward");
  op.dev(dinp, z(1L * N * C), "dinp").dev(dweight, z(1L * OC * C), "dweight");
  op.dev(dbias, z(OC), "dbias").dev(dout, z(1L * N * OC), "dout");
  op.dev(inp, z(1L * N * C), "inp").dev(weight, z(1L * OC * C), "weight");
  op.run([&] { cpu_->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC); });
}

void CheckedBackend::matmul_backward_input(float* dinp, const float* dout, const float* weight,
                                           int N, int C, int OC) {
  Op op(*this, "matmul_backward_input");
  op.dev(dinp, z(1L * N * C), "dinp").dev(dout, z(1L * N * OC), "dout");
  op.dev(weight, z(1L * OC * C), "weight");
  op.run([&] { cpu_->matmul_backward_input(dinp, dout, weight, N, C, OC); });
}

void CheckedBackend::matmul_backward_weight(float* dweight, float* dbias, const float* dout,
                                            const float* inp, int N, int C, int OC) {
  Op op(*this, "matmul_backward_weight");
  op.dev(dweight, z(1L * OC * C), "dweight").dev(dbias, z(OC), "dbias");
  op.dev(dout, z(1L * N * OC), "dout").dev(inp, z(1L * N * C), "inp");
  op.run([&] { cpu_->matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC); });
}

void CheckedBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                       const float* weight, const float* bias, int N, int C) {
  Op op(*this, "layernorm_forward");
  op.dev(out, z(1L * N * C), "out").dev(mean, z(N), "mean").dev(rstd, z(N), "rstd");
  op.dev(inp, z(1L * N * C), "inp").dev(weight, z(C), "weight").dev(bias, z(C), "bias");
  op.run([&] { cpu_->layernorm_forward(out, mean, rstd, inp, weight, bias, N, C); });
}

void CheckedBackend::layernorm_backward(float* dinp, float* dweight, float* dbias,
                                        const float* dout, const float* inp, const float* weight,
                                        const float* mean, const float* rstd, int N, int C) {
  Op op(*this, "layernorm_backward");
  op.dev(dinp, z(1L * N * C), "dinp").dev(dweight, z(C), "dweight").dev(dbias, z(C), "dbias");
  op.dev(dout, z(1L * N * C), "dout").dev(inp, z(1L * N * C), "inp").dev(weight, z(C), "weight");
  op.dev(mean, z(N), "mean").dev(rstd, z(N), "rstd");
  op.run(
      [&] { cpu_->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C); });
}

void CheckedBackend::gelu_forward(float* out, const float* inp, long N) {
  Op op(*this, "gelu_forward");
  op.dev(out, z(N), "out").dev(inp, z(N), "inp");
  op.run([&] { cpu_->gelu_forward(out, inp, N); });
}

void CheckedBackend::gelu_backward(float* dinp, const float* inp, const float* dout, long N) {
  Op op(*this, "gelu_backward");
  op.dev(dinp, z(N), "dinp").dev(inp, z(N), "inp").dev(dout, z(N), "dout");
  op.run([&] { cpu_->gelu_backward(dinp, inp, dout, N); });
}

void CheckedBackend::attention_forward(float* out, float* att, const float* qkv,
                                       const uint8_t* key_mask, bool causal, int B, int T, int C,
                                       int NH) {
  Op op(*this, "attention_forward");
  op.dev(out, z(1L * B * T * C), "out").dev(att, z(1L * B * NH * T * T), "att");
  op.dev(qkv, z(3L * B * T * C), "qkv").host(key_mask, z(1L * B * T), "key_mask");
  op.run([&] { cpu_->attention_forward(out, att, qkv, key_mask, causal, B, T, C, NH); });
}

void CheckedBackend::attention_backward(float* dqkv, float* scratch, const float* dout,
                                        const float* qkv, const float* att, int B, int T, int C,
                                        int NH, bool causal) {
  Op op(*this, "attention_backward");
  op.dev(dqkv, z(3L * B * T * C), "dqkv").dev(scratch, z(1L * B * NH * T * T), "scratch");
  op.dev(dout, z(1L * B * T * C), "dout").dev(qkv, z(3L * B * T * C), "qkv");
  op.dev(att, z(1L * B * NH * T * T), "att");
  op.run([&] { cpu_->attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH, causal); });
}

int CheckedBackend::crossentropy_forward(float* losses, float* probs, const float* logits,
                                         const int32_t* targets, int N, int V) {
  Op op(*this, "crossentropy_forward");
  op.dev(losses, z(N), "losses").dev(probs, z(1L * N * V), "probs");
  op.dev(logits, z(1L * N * V), "logits").host(targets, z(N) * sizeof(int32_t), "targets");
  return op.run([&] { return cpu_->crossentropy_forward(losses, probs, logits, targets, N, V); });
}

int CheckedBackend::crossentropy_forward_backward(float* losses, float* dlogits,
                                                  const float* logits, const int32_t* targets,
                                                  float dloss, int N, int V) {
  Op op(*this, "crossentropy_forward_backward");
  op.dev(losses, z(N), "losses").dev(dlogits, z(1L * N * V), "dlogits");
  op.dev(logits, z(1L * N * V), "logits").host(targets, z(N) * sizeof(int32_t), "targets");
  return op.run([&] {
    return cpu_->crossentropy_forward_backward(losses, dlogits, logits, targets, dloss, N, V);
  });
}

double CheckedBackend::sum_losses(const float* losses, int N) {
  Op op(*this, "sum_losses");
  op.dev(losses, z(N), "losses");
  return op.run([&] { return cpu_->sum_losses(losses, N); });
}

void CheckedBackend::encoder_forward(float* out, const int32_t* tokens, const int32_t* segments,
                                     const float* wte, const float* wpe, const float* wse, int B,
                                     int T, int C) {
  Op op(*this, "encoder_forward");
  op.dev(out, z(1L * B * T * C), "out");
  op.embedding(tokens, segments, {wte, wpe, wse}, {"wte", "wpe", "wse"}, B, T, C);
  op.run([&] { cpu_->encoder_forward(out, tokens, segments, wte, wpe, wse, B, T, C); });
}

void CheckedBackend::encoder_backward(float* dwte, float* dwpe, float* dwse, const float* dout,
                                      const int32_t* tokens, const int32_t* segments, int B, int T,
                                      int C) {
  Op op(*this, "encoder_backward");
  op.dev(dout, z(1L * B * T * C), "dout");
  op.embedding(tokens, segments, {dwte, dwpe, dwse}, {"dwte", "dwpe", "dwse"}, B, T, C);
  op.run([&] { cpu_->encoder_backward(dwte, dwpe, dwse, dout, tokens, segments, B, T, C); });
}

void CheckedBackend::residual_forward(float* out, const float* a, const float* b, long N) {
  Op op(*this, "residual_forward");
  op.dev(out, z(N), "out").dev(a, z(N), "a").dev(b, z(N), "b");
  op.run([&] { cpu_->residual_forward(out, a, b, N); });
}

void CheckedBackend::residual_backward(float* da, float* db, const float* dout, long N) {
  Op op(*this, "residual_backward");
  op.dev(da, z(N), "da").dev(db, z(N), "db").dev(dout, z(N), "dout");
  op.run([&] { cpu_->residual_backward(da, db, dout, N); });
}

void CheckedBackend::accumulate(float* dst, const float* src, long N) {
  Op op(*this, "accumulate");
  op.dev(dst, z(N), "dst").dev(src, z(N), "src");
  op.run([&] { cpu_->accumulate(dst, src, N); });
}

void CheckedBackend::fill_zero(float* dst, long N) {
  Op op(*this, "fill_zero");
  op.dev(dst, z(N), "dst");
  op.run([&] { cpu_->fill_zero(dst, N); });
}

void CheckedBackend::scale_inplace(float* dst, float s, long N) {
  Op op(*this, "scale_inplace");
  op.dev(dst, z(N), "dst");
  op.run([&] { cpu_->scale_inplace(dst, s, N); });
}

void CheckedBackend::gather_rows(float* out, const float* x, const int32_t* rows, int n, int C) {
  Op op(*this, "gather_rows");
  op.host(rows, z(n) * sizeof(int32_t), "rows");
  op.dev(out, z(1L * n * C), "out").dev(x, z((max_index(rows, n) + 1L) * C), "x");
  op.run([&] { cpu_->gather_rows(out, x, rows, n, C); });
}

void CheckedBackend::scatter_rows(float* out, const float* x, const int32_t* rows, int n, int C) {
  Op op(*this, "scatter_rows");
  op.host(rows, z(n) * sizeof(int32_t), "rows");
  op.dev(out, z((max_index(rows, n) + 1L) * C), "out").dev(x, z(1L * n * C), "x");
  op.run([&] { cpu_->scatter_rows(out, x, rows, n, C); });
}

void CheckedBackend::adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                                  const AdamWParams& p, long t, float grad_scale,
                                  const DelayCorrection& correction) {
  Op op(*this, "adamw_update");
  op.dev(params, n, "params").dev(grads, n, "grads").dev(m, n, "m").dev(v, n, "v");
  op.dev(correction.delta, n, "correction.delta");
  op.dev(correction.mean_square, n, "correction.mean_square");
  const SecantState& st = correction.secant;
  op.dev(st.weights, n, "secant.weights").dev(st.grad, n, "secant.grad");
  op.dev(st.num, n, "secant.num").dev(st.den, n, "secant.den");
  op.run([&] { cpu_->adamw_update(params, grads, m, v, n, p, t, grad_scale, correction); });
}

void CheckedBackend::sgd_update(float* params, const float* grads, float* momentum_buf, size_t n,
                                const SGDParams& p, float grad_scale,
                                const DelayCorrection& correction) {
  Op op(*this, "sgd_update");
  op.dev(params, n, "params").dev(grads, n, "grads").dev(momentum_buf, n, "momentum_buf");
  op.dev(correction.delta, n, "correction.delta");
  op.dev(correction.mean_square, n, "correction.mean_square");
  const SecantState& st = correction.secant;
  op.dev(st.weights, n, "secant.weights").dev(st.grad, n, "secant.grad");
  op.dev(st.num, n, "secant.num").dev(st.den, n, "secant.den");
  op.run([&] { cpu_->sgd_update(params, grads, momentum_buf, n, p, grad_scale, correction); });
}

void CheckedBackend::xpipe_predict(float* out, const float* w, const float* m, const float* v,
                                   size_t n, const WeightPrediction& p) {
  Op op(*this, "xpipe_predict");
  op.dev(out, n, "out").dev(w, n, "w").dev(m, n, "m").dev(v, n, "v");
  op.run([&] { cpu_->xpipe_predict(out, w, m, v, n, p); });
}

double CheckedBackend::grad_sumsq(const float* grads, size_t n) {
  Op op(*this, "grad_sumsq");
  op.dev(grads, n, "grads");
  return op.run([&] { return cpu_->grad_sumsq(grads, n); });
}

}  // namespace actorpipe
