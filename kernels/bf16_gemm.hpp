// bf16 GEMM: row-major C = op(A)·op(B) (+ C) with bf16 A and B and an f32 C, accumulated in f32,
// through oneDNN matmul primitives. Split into pieces of output rows (up to four per thread of
// the Context), which the threads take as they become free: a faster core computes more of
// them. Each piece is one oneDNN call on one thread (its OpenMP budget set to 1), so stages in
// one process never oversubscribe the cores. A primitive is created once per shape and thread,
// and reused.
#pragma once

#include <string>

#include "kernels/bf16.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

/// op(A) is (M, K), op(B) is (K, N), C is (M, N); lda/ldb/ldc are row strides of the stored
/// matrices. accumulate: C += op(A)·op(B); otherwise C = op(A)·op(B). bias (N floats, or null)
/// is added to every row by the product itself. The same inputs and thread count give the same
/// bits (the pieces depend on M and the thread count, never on which thread runs one).
void gemm_bf16(Context& ctx, bool trans_a, bool trans_b, int M, int N, int K, const bf16* A,
               int lda, const bf16* B, int ldb, bool accumulate, float* C, int ldc,
               const float* bias = nullptr);

/// The same on the calling thread alone (inside parallel regions).
void gemm_bf16_serial(bool trans_a, bool trans_b, int M, int N, int K, const bf16* A, int lda,
                      const bf16* B, int ldb, bool accumulate, float* C, int ldc,
                      const float* bias = nullptr);

/// One gemm_bf16_serial call as an observer sees it (the operands are the caller's).
struct Bf16GemmCall {
  bool trans_a = false, trans_b = false;
  int M = 0, N = 0, K = 0;
  const bf16* A = nullptr;
  int lda = 0;
  const bf16* B = nullptr;
  int ldb = 0;
  bool accumulate = false;
  float* C = nullptr;
  int ldc = 0;
  const float* bias = nullptr;
};
/// Installs `fn` (null: none), called on the calling thread with every gemm_bf16_serial call
/// before it runs: the benchmarks record a step's bf16 products with it to replay them alone.
void set_bf16_gemm_observer(void (*fn)(const Bf16GemmCall&));

/// What this machine offers bf16 products.
struct Bf16Support {
  bool avx512_bf16 = false;  ///< the CPU has AVX512_BF16 (cpuid)
  bool amx_bf16 = false;     ///< the CPU has AMX-BF16 tiles (cpuid)
  std::string isa;           ///< the instruction set oneDNN dispatches to, e.g. "avx512_core_bf16"
  /// oneDNN runs bf16 products on bf16 instructions (AVX512_BF16 or AMX) here; without them it
  /// would emulate them, slower than fp32, and pipeline.precision = "bf16" is refused.
  bool native = false;
  /// oneDNN can compute bf16 products here at all, natively or emulated on AVX-512 (a bf16
  /// matmul primitive could be created). False on a CPU without AVX-512 (oneDNN 2.6 then has
  /// no bf16 matmul): gemm_bf16 would throw.
  bool products = false;
  /// "bf16 instructions: AMX-BF16" ("AVX512_BF16 (no AMX)", "none"), ", oneDNN ISA <isa>",
  /// and ", no bf16 products in oneDNN" where `products` is false.
  std::string describe() const;
};
/// Detected once per process (ONEDNN_MAX_CPU_ISA, read by oneDNN at its first use, lowers isa).
const Bf16Support& bf16_support();

/// One product of a transformer's shape (512×768 · 768×768) timed on this machine's calling
/// thread in bf16 (gemm_bf16_serial) and fp32 (gemm_serial): the median of 5 after a warm-up.
/// On Intel processors without AMX the bf16 kernels can be slower than fp32; a run asked to
/// compute in bf16 measures this (about 30 ms) to say so.
struct Bf16Speed {
  double bf16_gflops = 0.0;
  double fp32_gflops = 0.0;
  /// bf16 / fp32 (0 when nothing was measured).
  double ratio() const { return fp32_gflops > 0.0 ? bf16_gflops / fp32_gflops : 0.0; }
  /// "bf16 products 310 GFLOP/s against fp32's 92 (3.4x) on one thread".
  std::string describe() const;
  /// A warning when bf16 products are slower than fp32 here, else empty.
  std::string slowdown_warning() const;
};
Bf16Speed measure_bf16_speed();

}  // namespace actorpipe
