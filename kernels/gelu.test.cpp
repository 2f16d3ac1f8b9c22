// GELU tests: forward against the double tanh formula over a wide range, backward against
// central differences, accumulation, same bits for any thread count.
#include "kernels/gelu.hpp"

#include <doctest/doctest.h>

#include <cmath>

#include "kernels/internal/test_util.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {
double gelu_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
}  // namespace

TEST_CASE("gelu forward matches the double formula from -12 to 12") {
  Context ctx(2);
  const long N = 24001;
  std::vector<float> x(static_cast<size_t>(N)), out(static_cast<size_t>(N));
  for (long i = 0; i < N; ++i) x[static_cast<size_t>(i)] = -12.0f + 0.001f * static_cast<float>(i);
  gelu_forward(ctx, out.data(), x.data(), N);
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = gelu_ref(x[i]);
  // tanh carries an absolute error of about 1e-7, scaled by 0.5·|x|.
  check_close("gelu", out, want, 1e-6, 2e-6);
}

TEST_CASE("gelu backward against central differences, accumulating") {
  Context ctx(2);
  Rng rng(8);
  const long N = 50;  // B=2, T=5, 5 channels: not a multiple of 16
  auto x = random_vec(static_cast<size_t>(N), rng, -4.0f, 4.0f);
  const auto g = random_vec(x.size(), rng);
  const auto init = random_vec(x.size(), rng);
  auto dx = init;
  gelu_backward(ctx, dx.data(), x.data(), g.data(), N);
  auto xd = to_double(x);
  auto num = numeric_grad(xd, [&] {
    double s = 0.0;
    for (size_t i = 0; i < xd.size(); ++i) s += gelu_ref(xd[i]) * g[i];
    return s;
  });
  for (size_t i = 0; i < num.size(); ++i) num[i] += init[i];
  check_close("dinp", dx, num, 2e-6, 1e-5);
}

TEST_CASE("gelu: same bits for 1, 2 and 3 threads") {
  Rng rng(9);
  const long N = 1037;
  const auto x = random_vec(static_cast<size_t>(N), rng, -6.0f, 6.0f);
  const auto g = random_vec(x.size(), rng);
  auto run = [&](int threads) {
    Context ctx(threads);
    std::vector<float> out(x.size()), dx(x.size(), 0.5f);
    gelu_forward(ctx, out.data(), x.data(), N);
    gelu_backward(ctx, dx.data(), x.data(), g.data(), N);
    out.insert(out.end(), dx.begin(), dx.end());
    return out;
  };
  const auto r1 = run(1);
  CHECK(bitwise_equal(r1, run(2)));
  CHECK(bitwise_equal(r1, run(3)));
}

TEST_CASE("gelu with bf16 output: the f32 forward rounded, for any thread count") {
  Rng rng(11);
  const long N = 1037;  // more than a block, not a multiple of one
  const auto x = random_vec(static_cast<size_t>(N), rng, -6.0f, 6.0f);
  Context one(1);
  std::vector<float> f32(x.size());
  gelu_forward(one, f32.data(), x.data(), N);
  std::vector<bf16> want(x.size());
  convert_to_bf16(f32.data(), want.data(), N);
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    Context ctx(threads);
    std::vector<bf16> got(x.size());
    gelu_forward(ctx, got.data(), x.data(), N);
    CHECK(got == want);
  }
}

TEST_CASE("gelu backward into bf16 with the bias gradient: gelu_backward, rounded, rows summed") {
  Rng rng(12);
  const int rows = 7, cols = 600;  // column slices of more than a block, not a multiple of one
  const size_t n = static_cast<size_t>(rows) * cols;
  const auto x = random_vec(n, rng, -6.0f, 6.0f);
  const auto g = random_vec(n, rng);
  auto b0 = random_vec(static_cast<size_t>(cols), rng);
  Context one(1);
  std::vector<float> v(n, 0.0f);
  gelu_backward(one, v.data(), x.data(), g.data(), static_cast<long>(n));
  std::vector<bf16> want(n);
  convert_to_bf16(v.data(), want.data(), static_cast<int64_t>(n));
  std::vector<float> want_b = b0;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      want_b[static_cast<size_t>(c)] += v[static_cast<size_t>(r) * cols + c];
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    Context ctx(threads);
    std::vector<bf16> got(n);
    std::vector<float> got_b = b0;
    gelu_backward(ctx, got.data(), got_b.data(), x.data(), g.data(), rows, cols);
    CHECK(got == want);
    CHECK(bitwise_equal(got_b, want_b));
  }
}
