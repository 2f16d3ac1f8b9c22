// GEMM tests: every transpose/alpha/beta/stride case against a double reference, and the
// same bits for 1, 2 and 3 threads on split-sized products.
#include "kernels/gemm.hpp"

#include <doctest/doctest.h>

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
