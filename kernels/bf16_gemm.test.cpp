// bf16 GEMM tests: every transpose combination, with and without accumulation, padded strides
// and odd sizes, against a double reference over the bf16-rounded inputs (so only f32
// accumulation error remains); repeated calls and a Context's threads keep the bits; the machine's
// bf16 support is described.
#include "kernels/bf16_gemm.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "kernels/internal/test_util.hpp"
#include "tests/support/bf16_skip.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

struct Case {
  int M, N, K;
};

// Stored (rows, cols) with row stride ld, random values rounded to bf16.
std::vector<bf16> random_bf16(int rows, int ld, Rng& rng) {
  std::vector<bf16> v(static_cast<size_t>(rows) * ld);
  for (auto& x : v) x = to_bf16(rng.uniform());
  return v;
}

}  // namespace

TEST_CASE("gemm_bf16 equals a double reference over the rounded inputs") {
  if (actorpipe::testing::skip_without_bf16_products()) return;
  Rng rng(5);
  Context ctx(2);
  for (const Case cs : {Case{7, 5, 3}, Case{64, 48, 40}, Case{200, 130, 97}, Case{1, 33, 64}}) {
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool acc : {false, true}) {
          CAPTURE(cs.M);
          CAPTURE(ta);
          CAPTURE(tb);
          CAPTURE(acc);
          const int M = cs.M, N = cs.N, K = cs.K;
          // stored shapes, each with a padded row stride
          const int ar = ta ? K : M, ac = ta ? M : K, lda = ac + 3;
          const int br = tb ? N : K, bc = tb ? K : N, ldb = bc + 5;
          const int ldc = N + 2;
          const auto A = random_bf16(ar, lda, rng);
          const auto B = random_bf16(br, ldb, rng);
          const auto C0 = random_vec(static_cast<size_t>(M) * ldc, rng);
          auto C = C0;
          gemm_bf16(ctx, ta, tb, M, N, K, A.data(), lda, B.data(), ldb, acc, C.data(), ldc);
          std::vector<double> want(C.size());
          std::vector<float> got(C.size());
          for (int i = 0; i < M; ++i)
            for (int j = 0; j < N; ++j) {
              double s = acc ? C0[static_cast<size_t>(i) * ldc + j] : 0.0, mag = 0.0;
              for (int k = 0; k < K; ++k) {
                const double a = to_f32(ta ? A[static_cast<size_t>(k) * lda + i]
                                           : A[static_cast<size_t>(i) * lda + k]);
                const double b = to_f32(tb ? B[static_cast<size_t>(j) * ldb + k]
                                           : B[static_cast<size_t>(k) * ldb + j]);
                s += a * b;
                mag += std::fabs(a * b);
              }
              const size_t at = static_cast<size_t>(i) * ldc + j;
              want[at] = s;
              got[at] = C[at];
              // f32 accumulation: K roundings of at most 2^-24 of the running magnitude
              const double tol = (K + 2) * 0x1p-24 * (mag + std::fabs(s)) + 1e-30;
              REQUIRE_MESSAGE(std::fabs(C[at] - s) <= tol, "C[", i, ",", j, "] = ", C[at], " want ",
                              s);
            }
          // the padding between rows is never written
          for (int i = 0; i < M; ++i)
            for (int j = N; j < ldc; ++j)
              REQUIRE(C[static_cast<size_t>(i) * ldc + j] == C0[static_cast<size_t>(i) * ldc + j]);
        }
  }
}

TEST_CASE("gemm_bf16 keeps its bits across calls and Contexts of the same thread count") {
  if (actorpipe::testing::skip_without_bf16_products()) return;
  Rng rng(9);
  const int M = 400, N = 256, K = 384;
  const auto A = random_bf16(M, K, rng);
  const auto B = random_bf16(N, K, rng);
  // C = op(A)·Bᵀ, A stored (M, K), or (K, M) and transposed
  auto product = [&](Context& ctx, bool ta) {
    std::vector<float> C(static_cast<size_t>(M) * N);
    gemm_bf16(ctx, ta, true, M, N, K, A.data(), ta ? M : K, B.data(), K, false, C.data(), N);
    return C;
  };
  auto run = [&](int threads, bool ta = false) {
    Context ctx(threads);
    return product(ctx, ta);
  };
  const auto one = run(1), two = run(2), two_ta = run(2, true);
  CHECK(bitwise_equal(one, run(1)));
  CHECK(bitwise_equal(two, run(2)));
  // the pieces of a split product go to whichever thread is free: with the Context's threads
  // slowed down by a busy neighbour, the bits stay those of the pieces
  {
    Context ctx(2);
    std::atomic<bool> stop{false};
    std::thread busy([&] {
      const auto t0 = std::chrono::steady_clock::now();
      while (!stop && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
      }
    });
    for (int rep = 0; rep < 20; ++rep) {
      CHECK(bitwise_equal(product(ctx, false), two));
      CHECK(bitwise_equal(product(ctx, true), two_ta));
    }
    stop = true;
    busy.join();
  }
  // not promised, but true of oneDNN's kernels on whole 96-row blocks: record it if it changes
  if (!bitwise_equal(one, two)) MESSAGE("gemm_bf16: 1 and 2 threads differ in some bits");
}

// libgomp's, oneDNN's OpenMP runtime (linked with the kernels)
extern "C" int omp_get_max_threads();

TEST_CASE("every thread of a Context that computed a bf16 product gives oneDNN one thread") {
  if (actorpipe::testing::skip_without_bf16_products()) return;
  // oneDNN (OpenMP runtime) sizes its parallel regions by the calling thread's OpenMP budget:
  // 1 on each of the Context's threads, so stages never oversubscribe the cores
  Rng rng(12);
  const int M = 192, N = 256, K = 256;
  const auto A = random_bf16(M, K, rng);
  const auto B = random_bf16(K, N, rng);
  Context ctx(2);
  // a product on each thread (a split product's pieces go to whichever thread is free: a
  // thread may compute none of them)
  ctx.parallel_for(2, [&](int, int64_t, int64_t) {
    std::vector<float> C(static_cast<size_t>(M) * N);
    gemm_bf16_serial(false, false, M, N, K, A.data(), K, B.data(), N, false, C.data(), N);
  });
  std::vector<int> budget(2, -1);
  ctx.parallel_for(
      2, [&](int c, int64_t, int64_t) { budget[static_cast<size_t>(c)] = omp_get_max_threads(); });
  CHECK(budget[0] == 1);
  CHECK(budget[1] == 1);
}

TEST_CASE("the bf16 speed measurement, and its warning when bf16 is the slower") {
  if (bf16_support().native) {
    const Bf16Speed s = measure_bf16_speed();
    CHECK(s.bf16_gflops > 0.0);
    CHECK(s.fp32_gflops > 0.0);
    MESSAGE(s.describe());
  }
  Bf16Speed slower{117.0, 196.0};  // an Intel Xeon's AVX512_BF16 kernels without AMX
  CHECK(slower.slowdown_warning() ==
        "on this CPU bf16 products are slower than fp32 (bf16 products 117 GFLOP/s against "
        "fp32's 196 (0.6x) on one thread): pipeline.precision = \"fp32\" would compute faster");
  CHECK(Bf16Speed{205.0, 91.0}.slowdown_warning().empty());
}

TEST_CASE("bf16_support names the instructions and oneDNN's ISA") {
  const Bf16Support& s = bf16_support();
  CHECK(!s.isa.empty());
  CHECK(s.describe().find(s.isa) != std::string::npos);
  if (s.native) CHECK((s.avx512_bf16 || s.amx_bf16));
  // oneDNN 2.6 computes bf16 products (natively or emulated) from AVX-512 on, none below it
  if (s.native) CHECK(s.products);
  CHECK(s.products == s.isa.starts_with("avx512_core"));
  CHECK((s.describe().find("no bf16 products in oneDNN") == std::string::npos) == s.products);
  MESSAGE(s.describe());
}

TEST_CASE("gemm_bf16 with a bias adds it to every row, split between threads or not") {
  if (actorpipe::testing::skip_without_bf16_products()) return;
  Rng rng(13);
  const int M = 500, N = 70, K = 40;
  const auto A = random_bf16(M, K, rng);
  const auto B = random_bf16(N, K, rng);
  const auto bias = random_vec(static_cast<size_t>(N), rng);
  for (int threads : {1, 2}) {
    Context ctx(threads);
    std::vector<float> with(static_cast<size_t>(M) * N, 9.0f), without(with.size(), 9.0f);
    gemm_bf16(ctx, false, true, M, N, K, A.data(), K, B.data(), K, false, with.data(), N,
              bias.data());
    gemm_bf16(ctx, false, true, M, N, K, A.data(), K, B.data(), K, false, without.data(), N);
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        const size_t at = static_cast<size_t>(i) * N + j;
        // one f32 rounding of the sum apart at most
        REQUIRE(std::fabs(with[at] - (without[at] + bias[static_cast<size_t>(j)])) <=
                0x1p-22 * (std::fabs(without[at]) + std::fabs(bias[static_cast<size_t>(j)])) +
                    1e-30);
      }
  }
}
