// GEMM: row-major C = alpha * op(A) * op(B) + beta * C through OpenBLAS sgemm, partitioned
// over the Context's threads by blocks of output rows, one per thread, taken by whichever thread
// is free (each output element computed by one thread).
#pragma once

#include "kernels/context.hpp"

namespace actorpipe {

/// gemm's pieces start at multiples of gemm_row_align() rows. OpenBLAS computes C in micro-tiles
/// whose height depends on the kernel it picked for the CPU at run time (24 rows on its Haswell
/// and Zen kernels, 16 on SkylakeX and Cooperlake, any row on Prescott's and Sandybridge's); a
/// row block that starts inside a micro-tile rounds differently. Column blocks never keep the
/// bits on the Haswell kernels (tested: kernels/gemm.test.cpp), so the output is split by rows
/// only. Every alignment gemm_row_align() may pick divides this one, so blocks at its multiples
/// keep the unsplit product's bits wherever gemm splits at all.
inline constexpr int kGemmRowAlign = 96;

/// The row alignments gemm_row_align() tries, smallest first (each divides kGemmRowAlign).
inline constexpr int kGemmRowAlignCandidates[] = {8, 16, 24, 32, 48, 96};

/// The smallest of kGemmRowAlignCandidates at which a product split into row blocks gives the
/// bits of the unsplit one with the OpenBLAS kernels this process runs, or 0 where none does
/// (gemm then never splits a product). Found once per process by computing products of each
/// transpose whole and in two blocks (a few milliseconds; every Context's constructor asks,
/// so that it happens before any timing or recording of products). The finer the alignment,
/// the more even the split: 256 rows (GPT-2's 4 × 64 tokens) went 96 + 160 at 96, 120 + 136 at
/// 24 (Haswell and Zen kernels).
int gemm_row_align();

/// Whether `align` rows are a whole number of micro-tiles of the running OpenBLAS kernels:
/// products of each transpose, split into blocks of `align` rows each on OpenBLAS's blocked
/// path, give the whole products' bits. What gemm_row_align() asks of each candidate.
bool gemm_row_align_keeps_bits(int align);

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
