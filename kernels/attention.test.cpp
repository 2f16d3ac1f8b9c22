// Attention tests: out and att against a double reference (causal, bidirectional with a key
// padding mask, fully masked queries), dqkv against central differences, the blocked causal
// path (T > 64), the causal flag of the backward, same bits for any thread count.
#include "kernels/attention.hpp"

#include <doctest/doctest.h>

#include <cmath>

#include "kernels/check.hpp"
#include "kernels/internal/test_util.hpp"
#include "tests/support/bf16_skip.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

struct Shape {
  int B, T, C, NH;
};

// Double reference; att_out (B,NH,T,T) optional.
std::vector<double> ref_forward(const std::vector<double>& qkv, const std::vector<uint8_t>* mask,
                                bool causal, const Shape& s,
                                std::vector<double>* att_out = nullptr) {
  const int hs = s.C / s.NH, C3 = 3 * s.C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::vector<double> out(static_cast<size_t>(s.B) * s.T * s.C, 0.0);
  if (att_out != nullptr) att_out->assign(static_cast<size_t>(s.B) * s.NH * s.T * s.T, 0.0);
  std::vector<double> w(static_cast<size_t>(s.T));
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        const double* q = qkv.data() + (static_cast<size_t>(b) * s.T + t) * C3 + h * hs;
        double mx = -1e300;
        bool any = false;
        for (int j = 0; j < s.T; ++j) {
          const bool ok = (!causal || j <= t) &&
                          (mask == nullptr || (*mask)[static_cast<size_t>(b) * s.T + j] != 0);
          if (!ok) {
            w[static_cast<size_t>(j)] = -1.0;
            continue;
          }
          const double* k = qkv.data() + (static_cast<size_t>(b) * s.T + j) * C3 + s.C + h * hs;
          double d = 0.0;
          for (int i = 0; i < hs; ++i) d += q[i] * k[i];
          w[static_cast<size_t>(j)] = d * scale;
          mx = std::max(mx, d * scale);
          any = true;
        }
        if (!any) continue;  // zeros
        std::vector<double> p(static_cast<size_t>(s.T), 0.0);
        double sum = 0.0;
        for (int j = 0; j < s.T; ++j) {
          const bool ok = (!causal || j <= t) &&
                          (mask == nullptr || (*mask)[static_cast<size_t>(b) * s.T + j] != 0);
          if (ok) {
            p[static_cast<size_t>(j)] = std::exp(w[static_cast<size_t>(j)] - mx);
            sum += p[static_cast<size_t>(j)];
          }
        }
        double* o = out.data() + (static_cast<size_t>(b) * s.T + t) * s.C + h * hs;
        for (int j = 0; j < s.T; ++j) {
          const double pj = p[static_cast<size_t>(j)] / sum;
          if (att_out != nullptr)
            (*att_out)[((static_cast<size_t>(b) * s.NH + h) * s.T + t) * s.T + j] = pj;
          const double* v = qkv.data() + (static_cast<size_t>(b) * s.T + j) * C3 + 2 * s.C + h * hs;
          for (int i = 0; i < hs; ++i) o[i] += pj * v[i];
        }
      }
  return out;
}

struct Run {
  std::vector<float> out, att, dqkv;
};

// qkv in f32, or already rounded to bf16 (the overloads on a bf16 qkv)
template <class Q>
Run run(Context& ctx, const std::vector<Q>& qkv, const std::vector<uint8_t>* mask, bool causal,
        const Shape& s, const std::vector<float>& dout, const std::vector<float>& dqkv_init,
        bool causal_backward) {
  Run r;
  r.out.assign(static_cast<size_t>(s.B) * s.T * s.C, -5.0f);
  r.att.assign(static_cast<size_t>(s.B) * s.NH * s.T * s.T, -5.0f);
  attention_forward(ctx, r.out.data(), r.att.data(), qkv.data(),
                    mask != nullptr ? mask->data() : nullptr, causal, s.B, s.T, s.C, s.NH);
  r.dqkv = dqkv_init;
  std::vector<float> scratch(static_cast<size_t>(ctx.threads()) * s.T * s.T, 1e30f);
  attention_backward(ctx, r.dqkv.data(), scratch.data(), dout.data(), qkv.data(), r.att.data(), s.B,
                     s.T, s.C, s.NH, causal_backward);
  return r;
}

void check_against_reference(const Shape& s, bool causal, const std::vector<uint8_t>* mask,
                             uint64_t seed, bool full_fd) {
  Rng rng(seed);
  Context ctx(2);
  const auto qkv = random_vec(static_cast<size_t>(s.B) * s.T * 3 * s.C, rng, -1.5f, 1.5f);
  const auto g = random_vec(static_cast<size_t>(s.B) * s.T * s.C, rng);
  const auto init = random_vec(qkv.size(), rng);
  const Run r = run(ctx, qkv, mask, causal, s, g, init, causal);
  auto xd = to_double(qkv);
  std::vector<double> att_ref;
  check_close("out", r.out, ref_forward(xd, mask, causal, s, &att_ref), 2e-6, 1e-5);
  check_close("att", r.att, att_ref, 1e-7, 1e-5);
  // Central differences of Σ g·out over every element of qkv (or a strided subset).
  auto loss = [&] { return project(ref_forward(xd, mask, causal, s), g); };
  std::vector<double> num(qkv.size());
  const size_t stride = full_fd ? 1 : 7;
  std::vector<float> got;
  std::vector<double> want;
  for (size_t i = 0; i < qkv.size(); i += stride) {
    const double x0 = xd[i];
    const double h = 1e-6;
    xd[i] = x0 + h;
    const double fp = loss();
    xd[i] = x0 - h;
    const double fm = loss();
    xd[i] = x0;
    got.push_back(r.dqkv[i]);
    want.push_back(static_cast<double>(init[i]) + (fp - fm) / (2 * h));
  }
  check_close("dqkv", got, want, 1e-5, 1e-4);
}

}  // namespace

TEST_CASE("causal attention against double reference and finite differences") {
  check_against_reference({2, 5, 8, 2}, true, nullptr, 16, true);
}

TEST_CASE("bidirectional attention with a key padding mask, incl. a fully masked sequence") {
  // Batch 0: keys 3 and 4 are padding; batch 1: every key is padding (queries get zeros).
  const std::vector<uint8_t> mask = {1, 1, 1, 0, 0, 0, 0, 0, 0, 0};
  check_against_reference({2, 5, 8, 2}, false, &mask, 17, true);
  check_against_reference({2, 5, 8, 2}, false, nullptr, 18, true);
  // Causal with padding: query 0 of batch 0 has no valid key.
  const std::vector<uint8_t> mask2 = {0, 1, 1, 1, 0, 1, 1, 0, 1, 1};
  check_against_reference({2, 5, 8, 2}, true, &mask2, 19, true);
}

TEST_CASE("blocked causal attention for T spanning several blocks") {
  check_against_reference({1, 150, 8, 2}, true, nullptr, 20, false);
  const Shape s{2, 70, 16, 2};
  std::vector<uint8_t> mask(static_cast<size_t>(s.B) * s.T, 1);
  for (int j = 60; j < 70; ++j) mask[static_cast<size_t>(j)] = 0;
  check_against_reference(s, true, &mask, 21, false);
}

TEST_CASE("attention masked entries of att are zero and rows sum to one") {
  const Shape s{2, 9, 8, 2};
  Rng rng(22);
  const auto qkv = random_vec(static_cast<size_t>(s.B) * s.T * 3 * s.C, rng);
  std::vector<uint8_t> mask(static_cast<size_t>(s.B) * s.T, 1);
  mask[2] = 0;
  Context ctx(1);
  std::vector<float> out(static_cast<size_t>(s.B) * s.T * s.C),
      att(static_cast<size_t>(s.B) * s.NH * s.T * s.T, 7.0f);
  attention_forward(ctx, out.data(), att.data(), qkv.data(), mask.data(), true, s.B, s.T, s.C,
                    s.NH);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < s.T; ++t) {
        const float* row = att.data() + ((static_cast<size_t>(b) * s.NH + h) * s.T + t) * s.T;
        double sum = 0.0;
        for (int j = 0; j < s.T; ++j) {
          if (j > t || (b == 0 && j == 2)) CHECK(row[j] == 0.0f);
          sum += row[j];
        }
        CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
      }
}

TEST_CASE("attention: same bits for 1, 2 and 3 threads, causal backward flag only skips zeros") {
  const Shape s{3, 130, 48, 4};
  Rng rng(23);
  const auto qkv = random_vec(static_cast<size_t>(s.B) * s.T * 3 * s.C, rng);
  const auto g = random_vec(static_cast<size_t>(s.B) * s.T * s.C, rng);
  const auto init = random_vec(qkv.size(), rng);
  std::vector<uint8_t> mask(static_cast<size_t>(s.B) * s.T, 1);
  for (int j = 100; j < 130; ++j) mask[static_cast<size_t>(s.T + j)] = 0;
  for (bool causal : {true, false}) {
    CAPTURE(causal);
    Context c1(1), c2(2), c3(3);
    const Run r1 = run(c1, qkv, &mask, causal, s, g, init, causal);
    for (Context* c : {&c1, &c2, &c3}) {
      const Run r = run(*c, qkv, &mask, causal, s, g, init, causal);
      CHECK(bitwise_equal(r.out, r1.out));
      CHECK(bitwise_equal(r.att, r1.att));
      CHECK(bitwise_equal(r.dqkv, r1.dqkv));
    }
    if (causal) {
      // The full backward on a causal att agrees to rounding.
      const Run full = run(c2, qkv, &mask, causal, s, g, init, false);
      check_close("dqkv full vs blocked", full.dqkv, to_double(r1.dqkv), 1e-5, 1e-4);
    }
  }
}

TEST_CASE("attention in bf16: near the double reference, the same bits for 1, 2 and 3 threads") {
  if (actorpipe::testing::skip_without_bf16_products()) return;
  // bf16 operands carry 8 significant bits: the scores, the probabilities and the outputs are
  // within a few 2^-8 of the exact values (inputs in [-1, 1), head size 12)
  const Shape s{2, 130, 48, 4};
  Rng rng(24);
  const auto qkv = random_vec(static_cast<size_t>(s.B) * s.T * 3 * s.C, rng);
  const auto g = random_vec(static_cast<size_t>(s.B) * s.T * s.C, rng);
  const auto init = random_vec(qkv.size(), rng);
  std::vector<uint8_t> mask(static_cast<size_t>(s.B) * s.T, 1);
  for (int j = 100; j < 130; ++j) mask[static_cast<size_t>(s.T + j)] = 0;
  for (bool causal : {true, false}) {
    CAPTURE(causal);
    Context f1(1), c1(1), c2(2), c3(3);
    for (Context* c : {&c1, &c2, &c3}) c->set_precision(Precision::bf16);
    const Run fp = run(f1, qkv, &mask, causal, s, g, init, causal);
    const Run r1 = run(c1, qkv, &mask, causal, s, g, init, causal);
    std::vector<double> att_ref;
    const auto out_ref = ref_forward(to_double(qkv), &mask, causal, s, &att_ref);
    check_close("out", r1.out, out_ref, 2e-2, 2e-2);
    check_close("att", r1.att, att_ref, 5e-3, 2e-2);
    double big = 0.0;
    for (float x : fp.dqkv) big = std::max(big, std::fabs(static_cast<double>(x)));
    check_close("dqkv vs fp32", r1.dqkv, to_double(fp.dqkv), 2e-2 * big, 2e-2);
    CHECK_FALSE(bitwise_equal(r1.out, fp.out));  // the bf16 products ran
    for (Context* c : {&c2, &c3}) {
      const Run r = run(*c, qkv, &mask, causal, s, g, init, causal);
      CHECK(bitwise_equal(r.out, r1.out));
      CHECK(bitwise_equal(r.att, r1.att));
      CHECK(bitwise_equal(r.dqkv, r1.dqkv));
    }
  }
}

TEST_CASE("attention in bf16 on a qkv already rounded: the bits of the f32 qkv's calls") {
  if (actorpipe::testing::skip_without_bf16_products()) return;
  const Shape s{2, 130, 48, 4};
  Rng rng(31);
  const auto qkv = random_vec(static_cast<size_t>(s.B) * s.T * 3 * s.C, rng);
  const auto g = random_vec(static_cast<size_t>(s.B) * s.T * s.C, rng);
  const auto init = random_vec(qkv.size(), rng);
  std::vector<bf16> qkv16(qkv.size());
  convert_to_bf16(qkv.data(), qkv16.data(), static_cast<int64_t>(qkv.size()));
  for (bool causal : {true, false}) {
    for (int threads : {1, 2}) {
      CAPTURE(causal);
      CAPTURE(threads);
      Context ctx(threads);
      ctx.set_precision(Precision::bf16);
      const Run want = run(ctx, qkv, nullptr, causal, s, g, init, causal);
      const Run got = run(ctx, qkv16, nullptr, causal, s, g, init, causal);
      CHECK(bitwise_equal(got.out, want.out));
      CHECK(bitwise_equal(got.att, want.att));
      CHECK(bitwise_equal(got.dqkv, want.dqkv));
    }
  }
  Context fp32(1);  // a bf16 qkv on a Context computing in fp32 is refused
  std::vector<float> out(static_cast<size_t>(s.B) * s.T * s.C),
      att(static_cast<size_t>(s.B) * s.NH * s.T * s.T);
  CHECK_THROWS_AS(attention_forward(fp32, out.data(), att.data(), qkv16.data(), nullptr, true, s.B,
                                    s.T, s.C, s.NH),
                  CheckFailure);
}
