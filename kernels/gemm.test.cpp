// GEMM tests: every transpose/alpha/beta/stride case against a double reference, and the
// same bits for 1, 2 and 3 threads on split-sized products.
#include "kernels/gemm.hpp"

#include <doctest/doctest.h>

#include "kernels/check.hpp"
#include "kernels/internal/test_util.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

struct Case {
  int M, N, K;
  bool ta, tb;
  float alpha, beta;
  int pad;  // extra leading-dimension elements
};

struct Operands {
  std::vector<float> A, B, C;
  int lda, ldb, ldc;
};

Operands make(const Case& c, Rng& rng) {
  Operands o;
  const int arows = c.ta ? c.K : c.M, acols = c.ta ? c.M : c.K;
  const int brows = c.tb ? c.N : c.K, bcols = c.tb ? c.K : c.N;
  o.lda = acols + c.pad;
  o.ldb = bcols + c.pad;
  o.ldc = c.N + c.pad;
  o.A = random_vec(static_cast<size_t>(arows) * o.lda, rng);
  o.B = random_vec(static_cast<size_t>(brows) * o.ldb, rng);
  o.C = random_vec(static_cast<size_t>(c.M) * o.ldc, rng);
  return o;
}

std::vector<double> reference(const Case& c, const Operands& o) {
  std::vector<double> C(o.C.begin(), o.C.end());
  for (int i = 0; i < c.M; ++i)
    for (int j = 0; j < c.N; ++j) {
      double s = 0.0;
      for (int k = 0; k < c.K; ++k) {
        const double a = c.ta ? o.A[static_cast<size_t>(k) * o.lda + i]
                              : o.A[static_cast<size_t>(i) * o.lda + k];
        const double b = c.tb ? o.B[static_cast<size_t>(j) * o.ldb + k]
                              : o.B[static_cast<size_t>(k) * o.ldb + j];
        s += a * b;
      }
      double& y = C[static_cast<size_t>(i) * o.ldc + j];
      y = c.alpha * s + c.beta * y;
    }
  return C;
}

std::vector<float> run(Context& ctx, const Case& c, const Operands& o) {
  std::vector<float> C = o.C;
  gemm(ctx, c.ta, c.tb, c.M, c.N, c.K, c.alpha, o.A.data(), o.lda, o.B.data(), o.ldb, c.beta,
       C.data(), o.ldc);
  return C;
}

}  // namespace

TEST_CASE("gemm matches a double reference for every transpose, alpha, beta and stride") {
  Rng rng(1);
  Context one(1), two(2);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f, -0.5f})
        for (auto shape : {std::array<int, 3>{7, 9, 5}, std::array<int, 3>{64, 33, 70},
                           std::array<int, 3>{300, 257, 120}}) {
          const Case c{shape[0], shape[1], shape[2], ta, tb, 0.75f, beta, 3};
          const Operands o = make(c, rng);
          const auto want = reference(c, o);
          // f32 accumulation over K terms of size <= 1: error well under 1e-5·K.
          const double tol = 2e-6 * c.K;
          check_close("gemm 1 thread", run(one, c, o), want, tol, 1e-5);
          check_close("gemm 2 threads", run(two, c, o), want, tol, 1e-5);
          // The padding between rows of C is untouched.
          const auto got = run(two, c, o);
          for (int i = 0; i < c.M; ++i)
            for (int p = 0; p < c.pad; ++p) {
              const size_t idx = static_cast<size_t>(i) * o.ldc + c.N + p;
              CHECK(got[idx] == o.C[idx]);
            }
        }
}

TEST_CASE("gemm gives the same bits for 1, 2 and 3 threads on model-sized products") {
  Rng rng(2);
  Context c1(1), c2(2), c3(3);
  // (M, N, K, ta, tb, beta): linear forward (NT), dinp (NN, beta 1), dweight (TN, beta 1),
  // a wide LM head, odd sizes that do not divide into micro-tiles.
  const Case cases[] = {
      {256, 2304, 768, false, true, 1.0f, 0.0f, 0},
      {256, 768, 2304, false, false, 1.0f, 1.0f, 0},
      {2304, 768, 256, true, false, 1.0f, 1.0f, 0},
      {2048, 1152, 384, false, true, 1.0f, 1.0f, 0},
      {128, 8192, 384, false, true, 1.0f, 0.0f, 0},
      {383, 517, 129, false, false, 1.0f, 0.0f, 0},
      {517, 383, 129, true, true, 1.0f, 1.0f, 0},
      {100, 1000, 300, false, true, 1.0f, 0.0f, 0},
      {40, 30, 20, false, false, 1.0f, 0.0f, 0},
      {1000, 100, 90, false, false, 1.0f, 0.0f, 0},
      // Just above OpenBLAS's small-matrix limit, so that halves would fall below it.
      {100, 37, 300, false, false, 1.0f, 0.0f, 0},
      {100, 37, 300, false, true, 1.0f, 1.0f, 0},
      {37, 100, 300, true, false, 1.0f, 0.0f, 0},
      {200, 200, 200, false, false, 1.0f, 0.0f, 0},
  };
  for (const Case& c : cases) {
    CAPTURE(c.M);
    CAPTURE(c.N);
    CAPTURE(c.K);
    const Operands o = make(c, rng);
    const auto r1 = run(c1, c, o);
    CHECK(bitwise_equal(r1, run(c1, c, o)));
    CHECK(bitwise_equal(r1, run(c2, c, o)));
    CHECK(bitwise_equal(r1, run(c3, c, o)));
  }
}

TEST_CASE("gemm_row_align: the smallest candidate that keeps the bits, and its multiples do too") {
  const int align = gemm_row_align();
  MESSAGE("gemm_row_align() = " << align);
  REQUIRE(align != 0);  // every OpenBLAS kernel tried so far has one
  CHECK(kGemmRowAlign % align == 0);
  CHECK(gemm_row_align() == align);  // found once
  CHECK(gemm_row_align_keeps_bits(align));
  CHECK(gemm_row_align_keeps_bits(2 * align));
  CHECK(gemm_row_align_keeps_bits(kGemmRowAlign));
  for (const int a : kGemmRowAlignCandidates) {
    if (a == align) break;
    CAPTURE(a);
    CHECK_FALSE(gemm_row_align_keeps_bits(a));
  }
  CHECK_THROWS_AS(gemm_row_align_keeps_bits(0), CheckFailure);
}

TEST_CASE("gemm splits rows at gemm_row_align(): blocks of it keep the bits on model shapes") {
  // what the probe checks on one shape, on the shapes of the GPT layers: each row block
  // starting at a multiple of the alignment, computed alone, gives the rows of the whole
  const int align = gemm_row_align();
  REQUIRE(align != 0);
  Rng rng(3);
  const Case cases[] = {
      {256, 768, 768, false, true, 1.0f, 0.0f, 0},    // forward (NT)
      {256, 3072, 768, false, false, 1.0f, 1.0f, 0},  // input gradient (NN, beta 1)
      {768, 768, 256, true, false, 1.0f, 1.0f, 0},    // weight gradient (TN, beta 1)
      {2048, 384, 1152, false, true, 1.0f, 0.0f, 3},  // with padded strides
  };
  for (const Case& c : cases) {
    CAPTURE(c.M);
    CAPTURE(c.N);
    CAPTURE(c.K);
    const Operands o = make(c, rng);
    std::vector<float> whole = o.C, blocks = o.C;
    gemm_serial(c.ta, c.tb, c.M, c.N, c.K, c.alpha, o.A.data(), o.lda, o.B.data(), o.ldb, c.beta,
                whole.data(), o.ldc);
    // blocks of 1, 2 and 3 alignments, repeating
    int m0 = 0;
    for (int k = 0; m0 < c.M; k = (k + 1) % 3) {
      const int rows = std::min(c.M - m0, (k + 1) * align);
      const float* a0 = c.ta ? o.A.data() + m0 : o.A.data() + static_cast<size_t>(m0) * o.lda;
      gemm_serial(c.ta, c.tb, rows, c.N, c.K, c.alpha, a0, o.lda, o.B.data(), o.ldb, c.beta,
                  blocks.data() + static_cast<size_t>(m0) * o.ldc, o.ldc);
      m0 += rows;
    }
    CHECK(bitwise_equal(whole, blocks));
  }
}
