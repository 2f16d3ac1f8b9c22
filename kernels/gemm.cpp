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
constexpr int kGemmAlign = kGemmRowAlign;
constexpr double kMinPieceMNK = kGemmMinPieceMNK;
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
