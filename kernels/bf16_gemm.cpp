// bf16 GEMM through oneDNN: per thread, a cache of matmul primitives keyed by shape, strides and
// accumulation, each with its memory objects; the scratchpad is the thread's own (user mode), so
// concurrent calls on several threads share nothing inside oneDNN. A split product's pieces go
// to whichever thread is free.
#include "kernels/bf16_gemm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "kernels/check.hpp"
#include "kernels/gemm.hpp"
#include "kernels/internal/row_split.hpp"

// libgomp's (oneDNN's OpenMP runtime, linked explicitly): declared here rather than through
// <omp.h>, which under clang would be libomp's
extern "C" void omp_set_num_threads(int);

namespace actorpipe {

namespace {

// Row blocks of a split product start at multiples of this (a whole number of oneDNN's M blocks).
constexpr int kBf16RowAlign = 96;
// A product is split only when every piece has at least this many multiply-adds.
constexpr double kBf16MinPieceMNK = 4.0 * 1024 * 1024;
// Pieces per thread of a split product, taken by whichever thread is free: the AMX units of
// two vCPUs ran 1.4-3.3x apart on the same product (docs/benchmarks.md), and an even split
// kept the faster one waiting. oneDNN's bits depend on a piece's rows, not on its thread.
constexpr int kBf16PiecesPerThread = 4;

dnnl::engine& cpu_engine() {
  static auto* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);  // lives as long as the process
  return *e;
}

struct Key {
  int M, N, K, lda, ldb, ldc;
  bool ta, tb, acc, bias;
  friend bool operator==(const Key&, const Key&) = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 1469598103934665603ull;
    for (int v : {k.M, k.N, k.K, k.lda, k.ldb, k.ldc,
                  int(k.ta) | int(k.tb) << 1 | int(k.acc) << 2 | int(k.bias) << 3})
      h = (h ^ static_cast<size_t>(v)) * 1099511628211ull;
    return h;
  }
};

struct Prim {
  dnnl::matmul matmul;
  dnnl::memory a, b, c, bias, scratch;
  // the execution arguments, made once: a call only sets the memory objects' data handles
  std::unordered_map<int, dnnl::memory> args;
  size_t scratch_bytes = 0;
};

// oneDNN's process-wide state, set up once before any thread uses it. Each thread keeps its own
// primitives (ThreadState), so oneDNN's global primitive cache is turned off: no primitive or
// cache entry is then shared between threads inside oneDNN, whose own synchronisation the thread
// sanitizer cannot see (it reported its cache's locks and keys as races). std::call_once orders
// every later call after the set-up.
void init_onednn() {
  static std::once_flag once;
  std::call_once(once, [] {
    dnnl::set_primitive_cache_capacity(0);
    (void)cpu_engine();
    (void)dnnl::get_effective_cpu_isa();
  });
}

// Whether oneDNN offers a bf16 matmul on this CPU at all: the primitive descriptor of a 1×1·1×1
// product (oneDNN 2.6 has none below AVX-512, not even its reference kernel).
bool bf16_matmul_available() {
  init_onednn();
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const dnnl::memory::desc a({1, 1}, dt::bf16, dims{1, 1}), b({1, 1}, dt::bf16, dims{1, 1});
  const dnnl::memory::desc c({1, 1}, dt::f32, dims{1, 1});
  try {
    (void)dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), cpu_engine());
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

// One per thread that computes bf16 products: its stream, primitives and scratchpad.
struct ThreadState {
  ThreadState() : stream((init_onednn(), cpu_engine())) {
    // oneDNN (OpenMP runtime) sizes its parallel regions and picks its blocking by this thread's
    // OpenMP budget; the Context already splits the work, so every call runs on one thread
    omp_set_num_threads(1);
  }
  dnnl::stream stream;
  std::unordered_map<Key, std::unique_ptr<Prim>, KeyHash> prims;
  std::vector<std::byte> scratch;
};

ThreadState& thread_state() {
  thread_local ThreadState s;
  return s;
}

Prim& primitive(ThreadState& ts, const Key& k) {
  auto it = ts.prims.find(k);
  if (it != ts.prims.end()) return *it->second;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const dnnl::memory::desc a({k.M, k.K}, dt::bf16, k.ta ? dims{1, k.lda} : dims{k.lda, 1});
  const dnnl::memory::desc b({k.K, k.N}, dt::bf16, k.tb ? dims{1, k.ldb} : dims{k.ldb, 1});
  const dnnl::memory::desc c({k.M, k.N}, dt::f32, dims{k.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (k.acc) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  auto& eng = cpu_engine();
  dnnl::matmul::primitive_desc pd;
  try {
    pd = k.bias
             ? dnnl::matmul::primitive_desc(
                   dnnl::matmul::desc(a, b, dnnl::memory::desc({1, k.N}, dt::f32, dims{k.N, 1}), c),
                   attr, eng)
             : dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, eng);
  } catch (const dnnl::error& e) {
    AP_CHECK(false,
             "oneDNN has no bf16 matmul for M={} N={} K={} (trans {} {}) on this CPU ({}): {}", k.M,
             k.N, k.K, k.ta, k.tb, bf16_support().describe(), e.what());
  }
  auto p = std::make_unique<Prim>();
  p->matmul = dnnl::matmul(pd);
  p->a = dnnl::memory(a, eng, DNNL_MEMORY_NONE);
  p->b = dnnl::memory(b, eng, DNNL_MEMORY_NONE);
  p->c = dnnl::memory(c, eng, DNNL_MEMORY_NONE);
  if (k.bias)
    p->bias =
        dnnl::memory(dnnl::memory::desc({1, k.N}, dt::f32, dims{k.N, 1}), eng, DNNL_MEMORY_NONE);
  p->scratch = dnnl::memory(pd.scratchpad_desc(), eng, DNNL_MEMORY_NONE);
  p->scratch_bytes = pd.scratchpad_desc().get_size();
  p->args = {{DNNL_ARG_SRC, p->a},
             {DNNL_ARG_WEIGHTS, p->b},
             {DNNL_ARG_DST, p->c},
             {DNNL_ARG_SCRATCHPAD, p->scratch}};
  if (k.bias) p->args.emplace(DNNL_ARG_BIAS, p->bias);
  return *ts.prims.emplace(k, std::move(p)).first->second;
}

std::atomic<void (*)(const Bf16GemmCall&)> g_observer{nullptr};

}  // namespace

void set_bf16_gemm_observer(void (*fn)(const Bf16GemmCall&)) {
  g_observer.store(fn);
}

void gemm_bf16_serial(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
                      const bf16* B, int ldb, bool accumulate, float* C, int ldc,
                      const float* bias) {
  if (M <= 0 || N <= 0) return;
  if (auto* observe = g_observer.load(std::memory_order_relaxed))
    observe(Bf16GemmCall{trans_a, trans_b, M, N, K, A, lda, B, ldb, accumulate, C, ldc, bias});
  if (K <= 0) {  // an empty sum: C = bias (or 0), C += bias (or unchanged)
    for (int i = 0; i < M; ++i) {
      float* row = C + static_cast<int64_t>(i) * ldc;
      for (int j = 0; j < N; ++j)
        row[j] = (accumulate ? row[j] : 0.0f) + (bias != nullptr ? bias[j] : 0.0f);
    }
    return;
  }
  ThreadState& ts = thread_state();
  Prim& p =
      primitive(ts, Key{M, N, K, lda, ldb, ldc, trans_a, trans_b, accumulate, bias != nullptr});
  if (ts.scratch.size() < p.scratch_bytes) ts.scratch.resize(p.scratch_bytes);
  p.a.set_data_handle(const_cast<bf16*>(A));
  p.b.set_data_handle(const_cast<bf16*>(B));
  p.c.set_data_handle(C);
  p.scratch.set_data_handle(ts.scratch.data());
  if (bias != nullptr) p.bias.set_data_handle(const_cast<float*>(bias));
  p.matmul.execute(ts.stream, p.args);
  ts.stream.wait();
}

void gemm_bf16(Context& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A,
               int lda, const bf16* B, int ldb, bool accumulate, float* C, int ldc,
               const float* bias) {
  AP_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm_bf16: negative size M={} N={} K={}", M, N, K);
  if (M == 0 || N == 0) return;
  internal::split_rows(ctx, M, kBf16RowAlign, static_cast<double>(N) * K, kBf16MinPieceMNK,
                       kBf16PiecesPerThread, [&](int m0, int rows) {
                         const bf16* a0 = trans_a ? A + m0 : A + static_cast<int64_t>(m0) * lda;
                         gemm_bf16_serial(trans_a, trans_b, rows, N, K, a0, lda, B, ldb, accumulate,
                                          C + static_cast<int64_t>(m0) * ldc, ldc, bias);
                       });
}

std::string Bf16Speed::describe() const {
  return fmt::format("bf16 products {:.0f} GFLOP/s against fp32's {:.0f} ({:.1f}x) on one thread",
                     bf16_gflops, fp32_gflops, ratio());
}

std::string Bf16Speed::slowdown_warning() const {
  if (ratio() >= 1.0 || fp32_gflops <= 0.0) return {};
  return fmt::format(
      "on this CPU bf16 products are slower than fp32 ({}): pipeline.precision = \"fp32\" "
      "would compute faster",
      describe());
}

Bf16Speed measure_bf16_speed() {
  constexpr int M = 512, N = 768, K = 768;
  std::vector<bf16> a(size_t{M} * K, to_bf16(0.5f)), b(size_t{K} * N, to_bf16(0.25f));
  std::vector<float> af(size_t{M} * K, 0.5f), bfl(size_t{K} * N, 0.25f), c(size_t{M} * N);
  auto gflops = [](const auto& run) {
    run();  // warm-up: the primitive, the pages
    std::vector<double> t;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      run();
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return 2.0 * M * N * K / t[2] / 1e9;
  };
  Bf16Speed s;
  s.bf16_gflops = gflops([&] {
    gemm_bf16_serial(false, false, M, N, K, a.data(), K, b.data(), N, false, c.data(), N);
  });
  s.fp32_gflops = gflops([&] {
    gemm_serial(false, false, M, N, K, 1.0f, af.data(), K, bfl.data(), N, 0.0f, c.data(), N);
  });
  return s;
}

std::string Bf16Support::describe() const {
  const char* units = amx_bf16 ? "AMX-BF16" : avx512_bf16 ? "AVX512_BF16 (no AMX)" : "none";
  return fmt::format("bf16 instructions: {}, oneDNN ISA {}{}", units, isa,
                     products ? "" : ", no bf16 products in oneDNN");
}

const Bf16Support& bf16_support() {
  static const Bf16Support s = [] {
    Bf16Support r;
#if defined(__x86_64__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
      r.amx_bf16 = (d >> 22) & 1u;
      const unsigned max_sub = a;
      if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) r.avx512_bf16 = (a >> 5) & 1u;
    }
#endif
    using isa = dnnl::cpu_isa;
    init_onednn();
    const isa e = dnnl::get_effective_cpu_isa();
    switch (e) {
      case isa::avx512_core_amx:
        r.isa = "avx512_core_amx";
        break;
      case isa::avx512_core_bf16:
        r.isa = "avx512_core_bf16";
        break;
      case isa::avx512_core_vnni:
        r.isa = "avx512_core_vnni";
        break;
      case isa::avx512_core:
        r.isa = "avx512_core";
        break;
      case isa::avx2_vnni:
        r.isa = "avx2_vnni";
        break;
      case isa::avx2:
        r.isa = "avx2";
        break;
      case isa::avx:
        r.isa = "avx";
        break;
      case isa::sse41:
        r.isa = "sse41";
        break;
      default:
        r.isa = fmt::format("0x{:x}", static_cast<unsigned>(e));
        break;
    }
    r.native =
        (r.avx512_bf16 || r.amx_bf16) && (e == isa::avx512_core_bf16 || e == isa::avx512_core_amx);
    r.products = bf16_matmul_available();
    return r;
  }();
  return s;
}

}  // namespace actorpipe
