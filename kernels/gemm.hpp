// GEMM: row-major C = alpha * op(A) * op(B) + beta * C through OpenBLAS sgemm, partitioned
// over the Context's threads by blocks of output rows (each output element computed by one thread).
#pragma once

#include "kernels/context.hpp"

namespace actorpipe {

/// gemm's pieces start at multiples of this many rows. OpenBLAS computes C in micro-tiles whose
/// height depends on the kernel it picked for the CPU at run time (24 rows on its Haswell and
/// Zen kernels, 16 on SkylakeX and Cooperlake); a row block that starts inside another tiling's
/// micro-tile rounds differently. 96 is a whole number of tiles on every one of them, so each
/// row gets the bits of the unsplit product. Column blocks never do on the Haswell kernels
/// (tested: kernels/gemm.test.cpp), so the output is split by rows only.
inline constexpr int kGemmRowAlign = 96;

/// gemm splits a product only when every piece has at least this many multiply-adds (M·N·K).
/// OpenBLAS 0.3.21 sends products below 28·512² (direct sgemm) or 100³ (small-matrix kernels)
/// to kernels that round differently from its blocked path; keeping the whole product and
/// every piece on the blocked path makes the result independent of the thread count. A caller
/// that computes a product in row blocks of its own gets the whole product's bits on the same
/// terms: blocks starting at multiples of kGemmRowAlign, each and the whole at least this.
inline constexpr double kGemmMinPieceMNK = 8.0 * 1024 * 1024;

/// op(A) is (M, K), op(B) is (K, N), C is (M, N); lda/ldb/ldc are row strides.
/// Products too small to be worth splitting run on the caller. Every piece of a split
/// product stays on OpenBLAS's blocked path and starts at a row where every OpenBLAS kernel's
/// micro-tiles start, so the result per element does not depend on the block bounds: it is
/// bitwise the same for any thread count (checked by the tests against the installed OpenBLAS
/// and the kernel it picked for this CPU).
void gemm(Context& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);

/// The same without partitioning (a single caller thread); used inside parallel regions.
void gemm_serial(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc);

}  // namespace actorpipe
