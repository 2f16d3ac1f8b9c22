// Encoder tests: forward against a double reference, backward against central differences
// and against an f32 sum in (b, t) order (bitwise), with and without segments, any thread count.
#include "kernels/encoder.hpp"

#include <doctest/doctest.h>

#include "kernels/internal/test_util.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

std::vector<double> ref_forward(const std::vector<int32_t>& tok, const std::vector<int32_t>* seg,
                                const std::vector<double>& wte, const std::vector<double>& wpe,
                                const std::vector<double>* wse, int B, int T, int C) {
  std::vector<double> out(static_cast<size_t>(B) * T * C);
  for (int r = 0; r < B * T; ++r)
    for (int c = 0; c < C; ++c) {
      double v = wte[static_cast<size_t>(tok[static_cast<size_t>(r)]) * C + c] +
                 wpe[static_cast<size_t>(r % T) * C + c];
      if (seg != nullptr) v += (*wse)[static_cast<size_t>((*seg)[static_cast<size_t>(r)]) * C + c];
      out[static_cast<size_t>(r) * C + c] = v;
    }
  return out;
}

}  // namespace

TEST_CASE("encoder forward and backward against double reference and finite differences") {
  const int B = 2, T = 5, C = 8, V = 11, maxT = 7, S = 2;
  Rng rng(10);
  Context ctx(2);
  for (bool with_seg : {false, true}) {
    CAPTURE(with_seg);
    // Repeated tokens so that rows of dwte receive several contributions.
    std::vector<int32_t> tok = {3, 1, 3, 3, 0, 10, 1, 3, 7, 7};
    std::vector<int32_t> seg = {0, 0, 1, 1, 1, 0, 1, 0, 1, 1};
    const auto wte = random_vec(static_cast<size_t>(V) * C, rng);
    const auto wpe = random_vec(static_cast<size_t>(maxT) * C, rng);
    const auto wse = random_vec(static_cast<size_t>(S) * C, rng);
    std::vector<float> out(static_cast<size_t>(B) * T * C);
    encoder_forward(ctx, out.data(), tok.data(), with_seg ? seg.data() : nullptr, wte.data(),
                    wpe.data(), with_seg ? wse.data() : nullptr, B, T, C);
    auto dte = to_double(wte), dpe = to_double(wpe), dse = to_double(wse);
    auto fwd = [&] {
      return ref_forward(tok, with_seg ? &seg : nullptr, dte, dpe, with_seg ? &dse : nullptr, B, T,
                         C);
    };
    check_close("out", out, fwd(), 1e-6, 1e-6);

    const auto g = random_vec(out.size(), rng);
    const auto i_te = random_vec(wte.size(), rng), i_pe = random_vec(wpe.size(), rng),
               i_se = random_vec(wse.size(), rng);
    auto gte = i_te, gpe = i_pe, gse = i_se;
    encoder_backward(ctx, gte.data(), gpe.data(), with_seg ? gse.data() : nullptr, g.data(),
                     tok.data(), with_seg ? seg.data() : nullptr, B, T, C);
    auto loss = [&] { return project(fwd(), g); };
    auto add = [](const std::vector<float>& init, std::vector<double> num) {
      for (size_t i = 0; i < num.size(); ++i) num[i] += init[i];
      return num;
    };
    check_close("dwte", gte, add(i_te, numeric_grad(dte, loss)), 1e-6, 1e-5);
    check_close("dwpe", gpe, add(i_pe, numeric_grad(dpe, loss)), 1e-6, 1e-5);
    if (with_seg) {
      check_close("dwse", gse, add(i_se, numeric_grad(dse, loss)), 1e-6, 1e-5);
    } else {
      CHECK(bitwise_equal(gse, i_se));
    }
  }
}

TEST_CASE("encoder backward sums every row in (b, t) order, for any thread count") {
  const int B = 4, T = 33, C = 72, V = 5, S = 3;
  Rng rng(11);
  std::vector<int32_t> tok(static_cast<size_t>(B) * T), seg(tok.size());
  for (auto& t : tok) t = rng.below(V);
  for (auto& s : seg) s = rng.below(S);
  const auto g = random_vec(tok.size() * C, rng, -1000.0f, 1000.0f);
  // The f32 reference: += in (b, t) order starting from the initial value.
  std::vector<float> want_te(static_cast<size_t>(V) * C, 0.25f),
      want_pe(static_cast<size_t>(T) * C, 0.5f), want_se(static_cast<size_t>(S) * C, 0.75f);
  for (size_t r = 0; r < tok.size(); ++r)
    for (int c = 0; c < C; ++c) {
      const float x = g[r * C + static_cast<size_t>(c)];
      want_te[static_cast<size_t>(tok[r]) * C + c] += x;
      want_pe[(r % T) * C + static_cast<size_t>(c)] += x;
      want_se[static_cast<size_t>(seg[r]) * C + c] += x;
    }
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    Context ctx(threads);
    std::vector<float> te(want_te.size(), 0.25f), pe(want_pe.size(), 0.5f),
        se(want_se.size(), 0.75f);
    encoder_backward(ctx, te.data(), pe.data(), se.data(), g.data(), tok.data(), seg.data(), B, T,
                     C);
    CHECK(bitwise_equal(te, want_te));
    CHECK(bitwise_equal(pe, want_pe));
    CHECK(bitwise_equal(se, want_se));
    std::vector<float> out(g.size()), out1(g.size());
    const auto wte = random_vec(static_cast<size_t>(V) * C, rng);
    encoder_forward(ctx, out.data(), tok.data(), seg.data(), wte.data(), want_pe.data(),
                    want_se.data(), B, T, C);
    Context one(1);
    encoder_forward(one, out1.data(), tok.data(), seg.data(), wte.data(), want_pe.data(),
                    want_se.data(), B, T, C);
    CHECK(bitwise_equal(out, out1));
  }
}
