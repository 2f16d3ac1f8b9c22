// Linear layer tests: forward against a double reference, backward against central
// differences of that reference, accumulation into gradients, same bits for 1 and 2 threads.
#include "kernels/matmul.hpp"

#include <doctest/doctest.h>

#include "kernels/bf16.hpp"
#include "kernels/bf16_gemm.hpp"
#include "kernels/internal/test_util.hpp"
#include "tests/support/bf16_skip.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

std::vector<double> ref_forward(const std::vector<double>& inp, const std::vector<double>& w,
                                const std::vector<double>* bias, int N, int C, int OC) {
  std::vector<double> out(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = bias != nullptr ? (*bias)[static_cast<size_t>(o)] : 0.0;
      for (int c = 0; c < C; ++c)
        s += inp[static_cast<size_t>(n) * C + c] * w[static_cast<size_t>(o) * C + c];
      out[static_cast<size_t>(n) * OC + o] = s;
    }
  return out;
}

}  // namespace

TEST_CASE("matmul forward and backward against double reference and finite differences") {
  const int N = 10, C = 8, OC = 12;  // N = B*T with B=2, T=5
  Rng rng(3);
  Context ctx(2);
  for (bool with_bias : {true, false}) {
    const auto inp = random_vec(static_cast<size_t>(N) * C, rng);
    const auto w = random_vec(static_cast<size_t>(OC) * C, rng);
    const auto b = random_vec(static_cast<size_t>(OC), rng);
    std::vector<float> out(static_cast<size_t>(N) * OC, 123.0f);
    matmul_forward(ctx, out.data(), inp.data(), w.data(), with_bias ? b.data() : nullptr, N, C, OC);
    auto di = to_double(inp), dw = to_double(w), db = to_double(b);
    check_close("out", out, ref_forward(di, dw, with_bias ? &db : nullptr, N, C, OC), 1e-5, 1e-5);

    // Backward with dout = g: gradients of L = Σ g·out, added onto non-zero initial values.
    const auto g = random_vec(out.size(), rng);
    const auto init_i = random_vec(inp.size(), rng), init_w = random_vec(w.size(), rng),
               init_b = random_vec(b.size(), rng);
    auto dinp = init_i, dweight = init_w, dbias = init_b;
    matmul_backward(ctx, dinp.data(), dweight.data(), with_bias ? dbias.data() : nullptr, g.data(),
                    inp.data(), w.data(), N, C, OC);
    auto loss = [&] {
      return project(ref_forward(di, dw, with_bias ? &db : nullptr, N, C, OC), g);
    };
    auto add = [](const std::vector<float>& init, std::vector<double> num) {
      for (size_t i = 0; i < num.size(); ++i) num[i] += init[i];
      return num;
    };
    check_close("dinp", dinp, add(init_i, numeric_grad(di, loss)), 1e-5, 1e-4);
    check_close("dweight", dweight, add(init_w, numeric_grad(dw, loss)), 1e-5, 1e-4);
    if (with_bias) {
      check_close("dbias", dbias, add(init_b, numeric_grad(db, loss)), 1e-5, 1e-4);
    } else {
      CHECK(bitwise_equal(dbias, init_b));
    }
    // dinp may be null.
    auto dweight2 = init_w;
    matmul_backward(ctx, nullptr, dweight2.data(), nullptr, g.data(), inp.data(), w.data(), N, C,
                    OC);
    CHECK(bitwise_equal(dweight2, dweight));
  }
}

TEST_CASE("matmul: same bits for 1 and 2 threads and across runs") {
  const int N = 512, C = 256, OC = 384;  // big enough for gemm to split
  Rng rng(4);
  const auto inp = random_vec(static_cast<size_t>(N) * C, rng);
  const auto w = random_vec(static_cast<size_t>(OC) * C, rng);
  const auto b = random_vec(static_cast<size_t>(OC), rng);
  const auto g = random_vec(static_cast<size_t>(N) * OC, rng);
  auto run = [&](int threads) {
    Context ctx(threads);
    std::vector<float> out(static_cast<size_t>(N) * OC);
    std::vector<float> dinp(inp.size(), 0.5f), dw(w.size(), 0.25f), db(b.size(), 1.0f);
    matmul_forward(ctx, out.data(), inp.data(), w.data(), b.data(), N, C, OC);
    matmul_backward(ctx, dinp.data(), dw.data(), db.data(), g.data(), inp.data(), w.data(), N, C,
                    OC);
    std::vector<float> all = out;
    all.insert(all.end(), dinp.begin(), dinp.end());
    all.insert(all.end(), dw.begin(), dw.end());
    all.insert(all.end(), db.begin(), db.end());
    return all;
  };
  const auto r1 = run(1);
  CHECK(bitwise_equal(r1, run(1)));
  CHECK(bitwise_equal(r1, run(2)));
}

TEST_CASE("matmul: the input and weight halves give matmul_backward's bits, in either order") {
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    if (precision == Precision::bf16 && !bf16_support().native) continue;
    CAPTURE(to_string(precision));
    const int N = 96, C = 64, OC = 80;
    Rng rng(5);
    const auto inp = random_vec(static_cast<size_t>(N) * C, rng);
    const auto w = random_vec(static_cast<size_t>(OC) * C, rng);
    const auto g = random_vec(static_cast<size_t>(N) * OC, rng);
    const auto init_i = random_vec(inp.size(), rng), init_w = random_vec(w.size(), rng),
               init_b = random_vec(static_cast<size_t>(OC), rng);
    Context ctx(2);
    ctx.set_precision(precision);
    auto di = init_i, dw = init_w, db = init_b;
    matmul_backward(ctx, di.data(), dw.data(), db.data(), g.data(), inp.data(), w.data(), N, C, OC);
    for (bool weight_first : {false, true}) {
      CAPTURE(weight_first);
      auto di2 = init_i, dw2 = init_w, db2 = init_b;
      if (weight_first)
        matmul_backward_weight(ctx, dw2.data(), db2.data(), g.data(), inp.data(), N, C, OC);
      matmul_backward_input(ctx, di2.data(), g.data(), w.data(), N, C, OC);
      if (!weight_first)
        matmul_backward_weight(ctx, dw2.data(), db2.data(), g.data(), inp.data(), N, C, OC);
      CHECK(bitwise_equal(di2, di));
      CHECK(bitwise_equal(dw2, dw));
      CHECK(bitwise_equal(db2, db));
    }
    // the bias gradient sums the f32 dout in either precision (in bf16 in the pass that
    // converts dout): the same bits
    Context f32(2);
    auto dw3 = init_w, db3 = init_b;
    matmul_backward_weight(f32, dw3.data(), db3.data(), g.data(), inp.data(), N, C, OC);
    CHECK(bitwise_equal(db3, db));
  }
}

TEST_CASE("matmul in bf16: the products of the bf16-rounded operands, accumulated in f32") {
  if (actorpipe::testing::skip_without_bf16_products()) return;
  const int N = 130, C = 72, OC = 96;
  Rng rng(6);
  const auto inp = random_vec(static_cast<size_t>(N) * C, rng);
  const auto w = random_vec(static_cast<size_t>(OC) * C, rng);
  const auto b = random_vec(static_cast<size_t>(OC), rng);
  const auto g = random_vec(static_cast<size_t>(N) * OC, rng);
  const auto init_i = random_vec(inp.size(), rng), init_w = random_vec(w.size(), rng),
             init_b = random_vec(b.size(), rng);
  auto rounded = [](const std::vector<float>& v) {
    std::vector<double> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = round_bf16(v[i]);
    return r;
  };
  const auto ri = rounded(inp), rw = rounded(w), rg = rounded(g), db = to_double(b);
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    Context ctx(threads);
    ctx.set_precision(Precision::bf16);
    std::vector<float> out(static_cast<size_t>(N) * OC);
    matmul_forward(ctx, out.data(), inp.data(), w.data(), b.data(), N, C, OC);
    // f32 accumulation of at most C + 1 terms of magnitude <= 1: a few 1e-6
    check_close("out", out, ref_forward(ri, rw, &db, N, C, OC), 2e-5, 1e-5);
    // and within bf16's rounding of the fp32 result (8 significant bits per operand)
    check_close("out vs fp32", out, ref_forward(to_double(inp), to_double(w), &db, N, C, OC),
                C * 0x1p-8, 0.0);

    auto dinp = init_i, dweight = init_w, dbias = init_b;
    matmul_backward(ctx, dinp.data(), dweight.data(), dbias.data(), g.data(), inp.data(), w.data(),
                    N, C, OC);
    std::vector<double> want_i(inp.size()), want_w(w.size()), want_b(b.size());
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) {
        double s = init_i[static_cast<size_t>(n) * C + c];
        for (int o = 0; o < OC; ++o)
          s += rg[static_cast<size_t>(n) * OC + o] * rw[static_cast<size_t>(o) * C + c];
        want_i[static_cast<size_t>(n) * C + c] = s;
      }
    for (int o = 0; o < OC; ++o) {
      double sb = init_b[static_cast<size_t>(o)];
      for (int n = 0; n < N; ++n) sb += g[static_cast<size_t>(n) * OC + o];  // dbias: f32 dout
      want_b[static_cast<size_t>(o)] = sb;
      for (int c = 0; c < C; ++c) {
        double s = init_w[static_cast<size_t>(o) * C + c];
        for (int n = 0; n < N; ++n)
          s += rg[static_cast<size_t>(n) * OC + o] * ri[static_cast<size_t>(n) * C + c];
        want_w[static_cast<size_t>(o) * C + c] = s;
      }
    }
    check_close("dinp", dinp, want_i, 2e-5, 1e-5);
    check_close("dweight", dweight, want_w, 4e-5, 1e-5);
    check_close("dbias", dbias, want_b, 2e-5, 1e-5);
  }
}
