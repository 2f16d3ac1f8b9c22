// LayerNorm tests: forward (out, mean, rstd) against a double reference, backward against
// central differences, accumulation, fixed-order dweight/dbias, same bits for 1 and 2 threads.
#include "kernels/layernorm.hpp"

#include <doctest/doctest.h>

#include <cmath>

#include "kernels/internal/test_util.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

struct Ref {
  std::vector<double> out, mean, rstd;
};

Ref ref_forward(const std::vector<double>& x, const std::vector<double>& w,
                const std::vector<double>& b, int N, int C) {
  Ref r{std::vector<double>(x.size()), std::vector<double>(static_cast<size_t>(N)),
        std::vector<double>(static_cast<size_t>(N))};
  for (int n = 0; n < N; ++n) {
    const double* row = x.data() + static_cast<size_t>(n) * C;
    double m = 0.0;
    for (int c = 0; c < C; ++c) m += row[c];
    m /= C;
    double v = 0.0;
    for (int c = 0; c < C; ++c) v += (row[c] - m) * (row[c] - m);
    v /= C;
    const double s = 1.0 / std::sqrt(v + 1e-5);
    for (int c = 0; c < C; ++c)
      r.out[static_cast<size_t>(n) * C + c] =
          (row[c] - m) * s * w[static_cast<size_t>(c)] + b[static_cast<size_t>(c)];
    r.mean[static_cast<size_t>(n)] = m;
    r.rstd[static_cast<size_t>(n)] = s;
  }
  return r;
}

}  // namespace

TEST_CASE("layernorm forward and backward against double reference and finite differences") {
  Rng rng(5);
  Context ctx(2);
  for (int C : {8, 40}) {  // 40: not a multiple of the 16 lanes
    const int N = 10;
    CAPTURE(C);
    auto x = random_vec(static_cast<size_t>(N) * C, rng, -2.0f, 3.0f);
    const auto w = random_vec(static_cast<size_t>(C), rng, 0.5f, 1.5f);
    const auto b = random_vec(static_cast<size_t>(C), rng);
    std::vector<float> out(x.size()), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
    layernorm_forward(ctx, out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                      C);
    auto dx = to_double(x), dw = to_double(w), db = to_double(b);
    const Ref r = ref_forward(dx, dw, db, N, C);
    check_close("out", out, r.out, 1e-5, 1e-5);
    check_close("mean", mean, r.mean, 1e-6, 1e-6);
    check_close("rstd", rstd, r.rstd, 1e-6, 1e-5);

    const auto g = random_vec(out.size(), rng);
    const auto i_x = random_vec(x.size(), rng), i_w = random_vec(w.size(), rng),
               i_b = random_vec(b.size(), rng);
    auto gx = i_x, gw = i_w, gb = i_b;
    layernorm_backward(ctx, gx.data(), gw.data(), gb.data(), g.data(), x.data(), w.data(),
                       mean.data(), rstd.data(), N, C);
    auto loss = [&] { return project(ref_forward(dx, dw, db, N, C).out, g); };
    auto add = [](const std::vector<float>& init, std::vector<double> num) {
      for (size_t i = 0; i < num.size(); ++i) num[i] += init[i];
      return num;
    };
    check_close("dinp", gx, add(i_x, numeric_grad(dx, loss)), 2e-5, 1e-4);
    check_close("dweight", gw, add(i_w, numeric_grad(dw, loss)), 2e-5, 1e-4);
    check_close("dbias", gb, add(i_b, numeric_grad(db, loss)), 2e-5, 1e-4);
  }
}

TEST_CASE("layernorm dbias is the f32 sum over rows in row order") {
  const int N = 37, C = 24;
  Rng rng(6);
  const auto x = random_vec(static_cast<size_t>(N) * C, rng);
  const auto w = random_vec(static_cast<size_t>(C), rng);
  const auto b = random_vec(static_cast<size_t>(C), rng);
  const auto g = random_vec(x.size(), rng, -100.0f, 100.0f);
  Context ctx(2);
  std::vector<float> out(x.size()), mean(N), rstd(N), gx(x.size()), gw(C), gb(C, 0.5f);
  layernorm_forward(ctx, out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  layernorm_backward(ctx, gx.data(), gw.data(), gb.data(), g.data(), x.data(), w.data(),
                     mean.data(), rstd.data(), N, C);
  std::vector<float> want(C, 0.5f);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) want[static_cast<size_t>(c)] += g[static_cast<size_t>(n) * C + c];
  CHECK(bitwise_equal(gb, want));
}

TEST_CASE("layernorm: same bits for 1, 2 and 3 threads and across runs") {
  const int N = 67, C = 200;
  Rng rng(7);
  const auto x = random_vec(static_cast<size_t>(N) * C, rng);
  const auto w = random_vec(static_cast<size_t>(C), rng);
  const auto b = random_vec(static_cast<size_t>(C), rng);
  const auto g = random_vec(x.size(), rng);
  auto run = [&](int threads) {
    Context ctx(threads);
    std::vector<float> out(x.size()), mean(N), rstd(N), gx(x.size(), 0.1f), gw(C, 0.2f),
        gb(C, 0.3f);
    layernorm_forward(ctx, out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                      C);
    layernorm_backward(ctx, gx.data(), gw.data(), gb.data(), g.data(), x.data(), w.data(),
                       mean.data(), rstd.data(), N, C);
    for (auto* v : {&mean, &rstd, &gx, &gw, &gb}) out.insert(out.end(), v->begin(), v->end());
    return out;
  };
  const auto r1 = run(1);
  CHECK(bitwise_equal(r1, run(1)));
  CHECK(bitwise_equal(r1, run(2)));
  CHECK(bitwise_equal(r1, run(3)));
}

TEST_CASE("layernorm with bf16 output: the f32 forward rounded, the same statistics") {
  for (int C : {200, 600}) {  // a row within one block and across three
    CAPTURE(C);
    const int N = 37;
    Rng rng(13);
    const auto x = random_vec(static_cast<size_t>(N) * C, rng);
    const auto w = random_vec(static_cast<size_t>(C), rng);
    const auto b = random_vec(static_cast<size_t>(C), rng);
    Context one(1);
    std::vector<float> f32(x.size()), mean(N), rstd(N);
    layernorm_forward(one, f32.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                      C);
    std::vector<bf16> want(x.size());
    convert_to_bf16(f32.data(), want.data(), static_cast<int64_t>(x.size()));
    for (int threads : {1, 2}) {
      CAPTURE(threads);
      Context ctx(threads);
      std::vector<bf16> got(x.size());
      std::vector<float> m2(N), r2(N);
      layernorm_forward(ctx, got.data(), m2.data(), r2.data(), x.data(), w.data(), b.data(), N, C);
      CHECK(got == want);
      CHECK(bitwise_equal(m2, mean));
      CHECK(bitwise_equal(r2, rstd));
    }
  }
}
