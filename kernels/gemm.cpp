// GEMM through single-threaded OpenBLAS sgemm calls, one per thread, each computing a
// contiguous block of rows of the output.
#include "kernels/gemm.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstdint>

#include "kernels/check.hpp"
#include "kernels/internal/row_split.hpp"

namespace actorpipe {

namespace {
// Chunk boundaries are multiples of this many rows. OpenBLAS computes C in micro-tiles whose
// height depends on the kernel it picked for the CPU at run time (24 rows on its Haswell and Zen
// kernels, 16 on SkylakeX and Cooperlake); a row block that starts inside another tiling's
// micro-tile rounds differently. 96 is a whole number of tiles on every one of them, so each row
// gets the bits of the unsplit product. Column blocks never do on the Haswell kernels (tested:
// kernels/gemm.test.cpp), so the output is split by rows only.
constexpr int kGemmAlign = 96;
// A GEMM is split only when every piece has at least this many multiply-adds. OpenBLAS
// 0.3.21 sends products below 28·512² (direct sgemm) or 100³ (small-matrix kernels) to
// kernels that round differently from its blocked path; keeping the whole product and
// every piece on the blocked path makes the result independent of the thread count.
constexpr double kMinPieceMNK = 8.0 * 1024 * 1024;

}  // namespace

void gemm_serial(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(Context& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  AP_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M={} N={} K={}", M, N, K);
  if (M == 0 || N == 0) return;
  internal::split_rows(ctx, M, kGemmAlign, static_cast<double>(N) * K, kMinPieceMNK,
                       [&](int m0, int rows) {
                         const float* a0 = trans_a ? A + m0 : A + static_cast<int64_t>(m0) * lda;
                         gemm_serial(trans_a, trans_b, rows, N, K, alpha, a0, lda, B, ldb, beta,
                                     C + static_cast<int64_t>(m0) * ldc, ldc);
                       });
}

}  // namespace actorpipe
