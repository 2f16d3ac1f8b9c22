// GEMM through single-threaded OpenBLAS sgemm calls, one per thread, each computing a
// contiguous block of rows of the output.
#include "kernels/gemm.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/check.hpp"
#include "kernels/internal/row_split.hpp"

namespace actorpipe {

namespace {
constexpr double kMinPieceMNK = kGemmMinPieceMNK;
// One piece per thread: OpenBLAS packs B again in every call, and more, smaller pieces were no
// faster at GPT small on two threads (docs/benchmarks.md).
constexpr int kPiecesPerThread = 1;

// A fixed pseudo-random fill in [-1, 1) (the probe must not depend on anything but the kernels).
void fill(std::vector<float>& v, uint32_t seed) {
  uint32_t x = seed;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
}
}  // namespace

bool gemm_row_align_keeps_bits(int align) {
  AP_CHECK(align >= 1, "gemm_row_align_keeps_bits: align = {}, must be >= 1", align);
  pin_blas_single_threaded();
  // two blocks of `align` rows, each on the blocked path (at least kGemmMinPieceMNK
  // multiply-adds), N = K a multiple of 16
  const int nk = (static_cast<int>(std::ceil(std::sqrt(kMinPieceMNK / align))) + 15) / 16 * 16;
  const int M = 2 * align, N = nk, K = nk;
  std::vector<float> A(static_cast<size_t>(M) * K), B(static_cast<size_t>(K) * N);
  std::vector<float> whole(static_cast<size_t>(M) * N), split(whole.size());
  fill(A, 1);
  fill(B, 2);
  for (int t = 0; t < 4; ++t) {
    const bool ta = (t & 1) != 0, tb = (t & 2) != 0;
    const int lda = ta ? M : K, ldb = tb ? K : N;
    // beta 1 over a filled C in half the cases: OpenBLAS scales C in a pass of its own
    const float beta = tb ? 1.0f : 0.0f;
    fill(whole, 3);
    fill(split, 3);
    gemm_serial(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, beta, whole.data(), N);
    for (int m0 = 0; m0 < M; m0 += align)
      gemm_serial(ta, tb, align, N, K, 1.0f, ta ? A.data() + m0 : A.data() + m0 * lda, lda,
                  B.data(), ldb, beta, split.data() + m0 * N, N);
    if (std::memcmp(whole.data(), split.data(), whole.size() * sizeof(float)) != 0) return false;
  }
  return true;
}

int gemm_row_align() {
  static const int align = [] {
    for (const int a : kGemmRowAlignCandidates)
      if (gemm_row_align_keeps_bits(a)) return a;
    return 0;
  }();
  return align;
}

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
  const int align = gemm_row_align();
  if (align == 0) {
    gemm_serial(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  internal::split_rows(ctx, M, align, static_cast<double>(N) * K, kMinPieceMNK, kPiecesPerThread,
                       [&](int m0, int rows) {
                         const float* a0 = trans_a ? A + m0 : A + static_cast<int64_t>(m0) * lda;
                         gemm_serial(trans_a, trans_b, rows, N, K, alpha, a0, lda, B, ldb, beta,
                                     C + static_cast<int64_t>(m0) * ldc, ldc);
                       });
}

}  // namespace actorpipe
