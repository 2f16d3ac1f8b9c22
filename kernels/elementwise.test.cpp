// Element-wise helper tests: exact results against plain f32 loops, aliasing, same bits for
// any thread count.
#include "kernels/elementwise.hpp"

#include <doctest/doctest.h>

#include "kernels/internal/test_util.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

TEST_CASE("residual forward/backward, accumulate, fill_zero and scale are exact") {
  Rng rng(12);
  const long N = 1003;
  const auto a = random_vec(static_cast<size_t>(N), rng);
  const auto b = random_vec(static_cast<size_t>(N), rng);
  const auto g = random_vec(static_cast<size_t>(N), rng);
  std::vector<float> sum(a.size()), da0(a.size()), db0(a.size()), sc(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    sum[i] = a[i] + b[i];
    da0[i] = a[i] + g[i];
    db0[i] = b[i] + g[i];
    sc[i] = a[i] * 0.37f;
  }
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    Context ctx(threads);
    std::vector<float> out(a.size(), -1.0f);
    residual_forward(ctx, out.data(), a.data(), b.data(), N);
    CHECK(bitwise_equal(out, sum));
    auto inplace = a;
    residual_forward(ctx, inplace.data(), inplace.data(), b.data(), N);
    CHECK(bitwise_equal(inplace, sum));
    auto da = a, db = b;
    residual_backward(ctx, da.data(), db.data(), g.data(), N);
    CHECK(bitwise_equal(da, da0));
    CHECK(bitwise_equal(db, db0));
    auto acc = a;
    accumulate(ctx, acc.data(), g.data(), N);
    CHECK(bitwise_equal(acc, da0));
    auto s = a;
    scale_inplace(ctx, s.data(), 0.37f, N);
    CHECK(bitwise_equal(s, sc));
    fill_zero(ctx, s.data(), N - 1);
    for (long i = 0; i < N - 1; ++i) CHECK(s[static_cast<size_t>(i)] == 0.0f);
    CHECK(s[static_cast<size_t>(N - 1)] == sc[static_cast<size_t>(N - 1)]);
  }
}

TEST_CASE("gather_rows and scatter_rows move whole rows, for any thread count") {
  const int C = 5, rows_in = 7;
  std::vector<float> x(static_cast<size_t>(rows_in) * C);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) + 0.5f;
  const std::vector<int32_t> rows = {6, 0, 3};
  for (int threads : {1, 2, 3}) {
    Context ctx(threads);
    std::vector<float> g(rows.size() * C, -1.0f);
    gather_rows(ctx, g.data(), x.data(), rows.data(), 3, C);
    for (size_t r = 0; r < rows.size(); ++r)
      for (int c = 0; c < C; ++c) CHECK(g[r * C + c] == x[static_cast<size_t>(rows[r]) * C + c]);
    std::vector<float> back(x.size(), 7.0f);
    scatter_rows(ctx, back.data(), g.data(), rows.data(), 3, C);
    for (int r = 0; r < rows_in; ++r) {
      const bool chosen = r == 6 || r == 0 || r == 3;
      for (int c = 0; c < C; ++c) {
        const size_t i = static_cast<size_t>(r) * C + c;
        CHECK(back[i] == (chosen ? x[i] : 7.0f));
      }
    }
  }
}
