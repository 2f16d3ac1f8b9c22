// Optimizer tests: several AdamW and SGD steps against hand-written double references of
// the torch.optim formulas, grad_sumsq against a long double sum and independent of the
// thread count, clip_scale cases.
#include "kernels/optimizer.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "kernels/check.hpp"
#include "kernels/internal/test_util.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

TEST_CASE("AdamW: five steps against a double reference (decoupled decay, bias correction)") {
  Rng rng(24);
  const size_t n = 1001;
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.95f;
  hp.eps = 1e-8f;
  hp.weight_decay = 0.1f;
  auto p = random_vec(n, rng);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<double> pd = to_double(p), md(n, 0.0), vd(n, 0.0);
  Context ctx(2);
  for (long t = 1; t <= 5; ++t) {
    const auto g = random_vec(n, rng, -2.0f, 2.0f);
    const float gs = t == 3 ? 0.5f : 1.0f;  // one clipped step
    adamw_update(ctx, p.data(), g.data(), m.data(), v.data(), n, hp, t, gs);
    const double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr;
    for (size_t i = 0; i < n; ++i) {
      const double gi = static_cast<double>(g[i]) * gs;
      pd[i] *= 1.0 - lr * hp.weight_decay;
      md[i] = b1 * md[i] + (1 - b1) * gi;
      vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
      const double mhat = md[i] / (1 - std::pow(b1, t));
      const double vhat = vd[i] / (1 - std::pow(b2, t));
      pd[i] -= lr * mhat / (std::sqrt(vhat) + hp.eps);
    }
    check_close("adamw m", m, md, 1e-6, 1e-5);
    check_close("adamw v", v, vd, 1e-7, 1e-5);
    check_close("adamw params", p, pd, 1e-6, 1e-5);
  }
  CHECK_THROWS_AS(adamw_update(ctx, p.data(), p.data(), m.data(), v.data(), n, hp, 0),
                  CheckFailure);
}

TEST_CASE("SGD with momentum and coupled weight decay: four steps against a double reference") {
  Rng rng(25);
  const size_t n = 517;
  SGDParams hp;
  hp.lr = 0.05f;
  hp.momentum = 0.9f;
  hp.weight_decay = 0.01f;
  auto p = random_vec(n, rng);
  std::vector<float> buf(n, 0.0f);
  std::vector<double> pd = to_double(p), bd(n, 0.0);
  Context ctx(2);
  for (int step = 0; step < 4; ++step) {
    const auto g = random_vec(n, rng);
    const float gs = step == 2 ? 0.25f : 1.0f;
    sgd_update(ctx, p.data(), g.data(), buf.data(), n, hp, gs);
    for (size_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(g[i]) * gs + hp.weight_decay * pd[i];
      // torch: the first step sets buf = d; later buf = momentum·buf + d.
      bd[i] = step == 0 ? d : hp.momentum * bd[i] + d;
      pd[i] -= hp.lr * bd[i];
    }
    check_close("sgd buf", buf, bd, 1e-6, 1e-5);
    check_close("sgd params", p, pd, 1e-6, 1e-5);
  }
}

TEST_CASE("AdamW with the nesterov correction: NAdam with a constant beta1, double reference") {
  Rng rng(31);
  const size_t n = 777;
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  auto p = random_vec(n, rng);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<double> pd = to_double(p), md(n, 0.0), vd(n, 0.0);
  Context ctx(2);
  DelayCorrection nesterov;
  nesterov.kind = DelayCorrectionKind::nesterov;
  for (long t = 1; t <= 5; ++t) {
    const auto g = random_vec(n, rng, -2.0f, 2.0f);
    const float gs = t == 2 ? 0.5f : 1.0f;
    adamw_update(ctx, p.data(), g.data(), m.data(), v.data(), n, hp, t, gs, nesterov);
    const double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr;
    for (size_t i = 0; i < n; ++i) {
      const double gi = static_cast<double>(g[i]) * gs;
      pd[i] *= 1.0 - lr * hp.weight_decay;
      md[i] = b1 * md[i] + (1 - b1) * gi;
      vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
      const double look =
          b1 * md[i] / (1 - std::pow(b1, t + 1)) + (1 - b1) * gi / (1 - std::pow(b1, t));
      pd[i] -= lr * look / (std::sqrt(vd[i] / (1 - std::pow(b2, t))) + hp.eps);
    }
    check_close("nadam m", m, md, 1e-6, 1e-5);
    check_close("nadam params", p, pd, 1e-6, 1e-5);
  }
}

TEST_CASE("AdamW with the nesterov correction and a momentum decay: torch's NAdam schedule") {
  // mu_t = beta1 (1 - 0.5 * 0.96^(t psi)); p -= lr ((1 - mu_t) / (1 - prod_{i<=t} mu_i) g +
  // mu_{t+1} / (1 - prod_{i<=t+1} mu_i) m) / (sqrt(v_hat) + eps), m and v as AdamW's
  Rng rng(33);
  const size_t n = 513;
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  const float psi = 0.004f;
  auto p = random_vec(n, rng);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<double> pd = to_double(p), md(n, 0.0), vd(n, 0.0);
  Context ctx(2);
  DelayCorrection nadam;
  nadam.kind = DelayCorrectionKind::nesterov;
  nadam.momentum_decay = psi;
  const double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr;
  auto mu = [&](long i) { return b1 * (1.0 - 0.5 * std::pow(0.96, i * static_cast<double>(psi))); };
  double product = 1.0;
  for (long t = 1; t <= 6; ++t) {
    const auto g = random_vec(n, rng, -2.0f, 2.0f);
    adamw_update(ctx, p.data(), g.data(), m.data(), v.data(), n, hp, t, 1.0f, nadam);
    product *= mu(t);
    const double on_g = lr * (1 - mu(t)) / (1 - product);
    const double on_m = lr * mu(t + 1) / (1 - product * mu(t + 1));
    for (size_t i = 0; i < n; ++i) {
      const double gi = g[i];
      pd[i] *= 1.0 - lr * hp.weight_decay;
      md[i] = b1 * md[i] + (1 - b1) * gi;
      vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
      pd[i] -= (on_m * md[i] + on_g * gi) / (std::sqrt(vd[i] / (1 - std::pow(b2, t))) + hp.eps);
    }
    check_close("nadam (momentum decay) params", p, pd, 1e-6, 1e-5);
  }
  // the schedule's look-ahead weight starts near half of beta1's (0.5 * 0.96^psi): less on the
  // momentum from the first update on, more on the gradient from the second (at t = 1 the
  // gradient's step is lr for any mu)
  const NadamSteps decayed1 = nadam_steps(hp.lr, hp.beta1, 1, psi);
  const NadamSteps constant1 = nadam_steps(hp.lr, hp.beta1, 1, 0.0f);
  CHECK(decayed1.on_m < 0.5f * constant1.on_m);
  CHECK(decayed1.on_g == doctest::Approx(hp.lr).epsilon(1e-6));
  CHECK(nadam_steps(hp.lr, hp.beta1, 2, psi).on_g > nadam_steps(hp.lr, hp.beta1, 2, 0.0f).on_g);
  CHECK_THROWS_AS(nadam_steps(hp.lr, hp.beta1, 1, -1.0f), CheckFailure);
}

TEST_CASE(
    "AdamW with the dc correction: g + lambda g^2 / (sqrt(v_hat) + eps) delta, double reference") {
  Rng rng(32);
  const size_t n = 555;
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  auto p = random_vec(n, rng);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<double> pd = to_double(p), md(n, 0.0), vd(n, 0.0);
  Context ctx(3);
  for (long t = 1; t <= 5; ++t) {
    const auto g = random_vec(n, rng, -2.0f, 2.0f);
    const auto delta = random_vec(n, rng, -0.05f, 0.05f);
    DelayCorrection dc;
    dc.kind = DelayCorrectionKind::dc;
    dc.lambda = 3.0f;
    dc.delta = t == 4 ? nullptr : delta.data();  // update 4: nothing stale
    const float gs = t == 3 ? 0.5f : 1.0f;
    adamw_update(ctx, p.data(), g.data(), m.data(), v.data(), n, hp, t, gs, dc);
    const double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr;
    for (size_t i = 0; i < n; ++i) {
      double gi = static_cast<double>(g[i]) * gs;
      if (t > 1 && t != 4) {  // at t = 1 there is no second moment yet
        const double vhat = vd[i] / (1 - std::pow(b2, t - 1));
        gi += dc.lambda * gi * gi / (std::sqrt(vhat) + hp.eps) * delta[i];
      }
      pd[i] *= 1.0 - lr * hp.weight_decay;
      md[i] = b1 * md[i] + (1 - b1) * gi;
      vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
      pd[i] -= lr * (md[i] / (1 - std::pow(b1, t))) /
               (std::sqrt(vd[i] / (1 - std::pow(b2, t))) + hp.eps);
    }
    check_close("dc m", m, md, 1e-6, 1e-5);
    check_close("dc v", v, vd, 1e-7, 1e-5);
    check_close("dc params", p, pd, 1e-6, 1e-5);
  }
}

TEST_CASE("SGD with the nesterov and dc corrections: double references") {
  Rng rng(33);
  const size_t n = 333;
  SGDParams hp;
  hp.lr = 0.05f;
  hp.momentum = 0.9f;
  hp.weight_decay = 0.01f;
  Context ctx(2);
  SUBCASE("nesterov") {
    auto p = random_vec(n, rng);
    std::vector<float> buf(n, 0.0f);
    std::vector<double> pd = to_double(p), bd(n, 0.0);
    DelayCorrection nesterov;
    nesterov.kind = DelayCorrectionKind::nesterov;
    for (int step = 0; step < 4; ++step) {
      const auto g = random_vec(n, rng);
      sgd_update(ctx, p.data(), g.data(), buf.data(), n, hp, 1.0f, nesterov);
      for (size_t i = 0; i < n; ++i) {
        const double d = static_cast<double>(g[i]) + hp.weight_decay * pd[i];
        bd[i] = step == 0 ? d : hp.momentum * bd[i] + d;
        pd[i] -= hp.lr * (d + hp.momentum * bd[i]);
      }
      check_close("nesterov sgd params", p, pd, 1e-6, 1e-5);
    }
  }
  SUBCASE("dc") {
    auto p = random_vec(n, rng);
    std::vector<float> buf(n, 0.0f), ms(n, 0.0f);
    std::vector<double> pd = to_double(p), bd(n, 0.0), msd(n, 0.0);
    for (long step = 1; step <= 4; ++step) {
      const auto g = random_vec(n, rng);
      const auto delta = random_vec(n, rng, -0.05f, 0.05f);
      DelayCorrection dc;
      dc.kind = DelayCorrectionKind::dc;
      dc.lambda = 2.0f;
      dc.delta = delta.data();
      dc.mean_square = ms.data();
      dc.ms_decay = 0.9f;
      dc.step = step;
      const float gs = step == 3 ? 0.25f : 1.0f;
      sgd_update(ctx, p.data(), g.data(), buf.data(), n, hp, gs, dc);
      for (size_t i = 0; i < n; ++i) {
        const double g0 = static_cast<double>(g[i]) * gs;
        double gi = g0;
        if (step > 1) {
          const double mshat = msd[i] / (1 - std::pow(0.9, step - 1));
          gi += dc.lambda * g0 * g0 / (std::sqrt(mshat) + 1e-8) * delta[i];
        }
        msd[i] = 0.9 * msd[i] + 0.1 * g0 * g0;
        const double d = gi + hp.weight_decay * pd[i];
        bd[i] = step == 1 ? d : hp.momentum * bd[i] + d;
        pd[i] -= hp.lr * bd[i];
      }
      check_close("dc sgd mean square", ms, msd, 1e-7, 1e-5);
      check_close("dc sgd params", p, pd, 1e-6, 1e-5);
    }
  }
}

namespace {

// The secant correction's state, n floats per array, and the DelayCorrection that uses it.
struct Secant {
  explicit Secant(size_t n) : w(n, 0.0f), g(n, 0.0f), num(n, 0.0f), den(n, 0.0f) {}
  std::vector<float> w, g, num, den;
  DelayCorrection correction(bool lookahead, const float* delta, long step, float decay) {
    DelayCorrection c;
    c.kind = DelayCorrectionKind::secant;
    c.lookahead = lookahead;
    c.delta = delta;
    c.step = step;
    c.secant = SecantState{w.data(), g.data(), num.data(), den.data()};
    c.secant_decay = decay;
    c.secant_pair = step > 1;
    return c;
  }
};

// One update's secant-corrected gradient of element i in double, from the float state before the
// update (p: the weights the update starts from); writes the state after it into the doubles.
double secant_reference(double g0, double p, double d, bool pair, double rho, double& s, double& gp,
                        double& num, double& den) {
  const double ws = p - d;
  double gi = g0;
  if (pair) {
    const double dx = ws - s, dg = g0 - gp;
    num = rho * num + (1 - rho) * dg * dx;
    den = rho * den + (1 - rho) * dx * dx;
    gi += (den > 0 ? std::max(0.0, num / den) : 0.0) * d;
  }
  s = ws;
  gp = g0;
  return gi;
}

}  // namespace

TEST_CASE("the secant correction, alone and with the look-ahead: each update against double") {
  // every update is checked from the float state before it (the correction takes differences of
  // nearby weights, whose float rounding a reference run in double from the start would drift
  // from); the first update only records, update 4 has nothing stale (Δ = 0). Δ moves the
  // gradients' weights by 0.3-0.5 per update, more than an update moves the weights, so no dx is
  // near 0 (where h = dg/dx of a first pair is ill-conditioned in float and in double alike).
  for (const bool adamw : {true, false}) {
    for (const bool lookahead : {false, true}) {
      CAPTURE(adamw);
      CAPTURE(lookahead);
      Rng rng(adamw ? 41 : 42);
      const size_t n = 517;
      const float rho = 0.8f;
      AdamWParams ha;
      ha.lr = 1e-2f;
      ha.weight_decay = 0.1f;
      SGDParams hs;
      hs.lr = 0.005f;
      hs.weight_decay = 0.01f;
      Context ctx(3);
      auto p = random_vec(n, rng);
      std::vector<float> m(n, 0.0f), v(n, 0.0f);
      Secant sec(n);
      for (long t = 1; t <= 6; ++t) {
        CAPTURE(t);
        const auto g = random_vec(n, rng, -2.0f, 2.0f);
        auto delta = random_vec(n, rng, 0.3f, 0.5f);
        for (float& x : delta) x *= -static_cast<float>(t);
        const float* d = t == 4 ? nullptr : delta.data();
        const float gs = t == 3 ? 0.5f : 1.0f;
        // the reference, from the state before the update
        std::vector<double> pd = to_double(p), md = to_double(m), vd = to_double(v);
        std::vector<double> sd = to_double(sec.w), gd = to_double(sec.g), nd = to_double(sec.num),
                            dd = to_double(sec.den);
        const DelayCorrection c = sec.correction(lookahead, d, t, rho);
        if (adamw)
          adamw_update(ctx, p.data(), g.data(), m.data(), v.data(), n, ha, t, gs, c);
        else
          sgd_update(ctx, p.data(), g.data(), m.data(), n, hs, gs, c);
        const NadamSteps k = nadam_steps(ha.lr, ha.beta1, t, 0.0f);
        for (size_t i = 0; i < n; ++i) {
          const double gi =
              secant_reference(static_cast<double>(g[i]) * gs, pd[i], d != nullptr ? d[i] : 0.0,
                               t > 1, rho, sd[i], gd[i], nd[i], dd[i]);
          if (adamw) {
            const double b1 = ha.beta1, b2 = ha.beta2;
            pd[i] *= 1.0 - ha.lr * ha.weight_decay;
            md[i] = b1 * md[i] + (1 - b1) * gi;
            vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
            const double denom = std::sqrt(vd[i] / (1 - std::pow(b2, t))) + ha.eps;
            pd[i] -= lookahead ? (k.on_m * md[i] + k.on_g * gi) / denom
                               : ha.lr * (md[i] / (1 - std::pow(b1, t))) / denom;
          } else {
            const double dd2 = gi + hs.weight_decay * pd[i];
            md[i] = hs.momentum * md[i] + dd2;
            pd[i] -= hs.lr * (lookahead ? dd2 + hs.momentum * md[i] : md[i]);
          }
        }
        check_close("secant weights", sec.w, sd, 1e-6, 1e-5);
        check_close("secant grad", sec.g, gd, 1e-7, 1e-6);
        check_close("secant num", sec.num, nd, 1e-7, 1e-4);
        check_close("secant den", sec.den, dd, 1e-9, 1e-4);
        check_close("secant m", m, md, 1e-5, 1e-4);
        if (adamw) check_close("secant v", v, vd, 1e-6, 1e-4);
        check_close("secant params", p, pd, 1e-5, 1e-4);
      }
      // the correction did something: the running means hold pairs
      CHECK(std::any_of(sec.den.begin(), sec.den.end(), [](float x) { return x > 0.0f; }));
    }
  }
}

TEST_CASE("the secant correction with nothing stale computes the plain rule's bits") {
  // Δ = 0 at every update (pipedream's last stage): h·0 adds nothing, whatever the estimate
  Rng rng(43);
  const size_t n = 300;
  Context ctx(2);
  for (const bool adamw : {true, false}) {
    CAPTURE(adamw);
    auto p = random_vec(n, rng), q = p;
    std::vector<float> m(n, 0.0f), v(n, 0.0f), mq(n, 0.0f), vq(n, 0.0f);
    Secant sec(n);
    for (long t = 1; t <= 4; ++t) {
      const auto g = random_vec(n, rng);
      const DelayCorrection c = sec.correction(false, nullptr, t, 0.9f);
      if (adamw) {
        adamw_update(ctx, p.data(), g.data(), m.data(), v.data(), n, AdamWParams{}, t, 1.0f, c);
        adamw_update(ctx, q.data(), g.data(), mq.data(), vq.data(), n, AdamWParams{}, t);
      } else {
        sgd_update(ctx, p.data(), g.data(), m.data(), n, SGDParams{}, 1.0f, c);
        sgd_update(ctx, q.data(), g.data(), mq.data(), n, SGDParams{});
      }
    }
    CHECK(bitwise_equal(p, q));
    CHECK(bitwise_equal(m, mq));
  }
}

TEST_CASE("AdamW with dc and the look-ahead: the dc gradient in NAdam's step, double reference") {
  Rng rng(44);
  const size_t n = 401;
  AdamWParams hp;
  hp.lr = 1e-2f;
  auto p = random_vec(n, rng);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<double> pd = to_double(p), md(n, 0.0), vd(n, 0.0);
  Context ctx(2);
  for (long t = 1; t <= 4; ++t) {
    const auto g = random_vec(n, rng, -2.0f, 2.0f);
    const auto delta = random_vec(n, rng, -0.05f, 0.05f);
    DelayCorrection dc;
    dc.kind = DelayCorrectionKind::dc;
    dc.lookahead = true;
    dc.lambda = 3.0f;
    dc.delta = delta.data();
    adamw_update(ctx, p.data(), g.data(), m.data(), v.data(), n, hp, t, 1.0f, dc);
    const NadamSteps k = nadam_steps(hp.lr, hp.beta1, t, 0.0f);
    const double b1 = hp.beta1, b2 = hp.beta2;
    for (size_t i = 0; i < n; ++i) {
      double gi = g[i];
      if (t > 1)
        gi += dc.lambda * gi * gi / (std::sqrt(vd[i] / (1 - std::pow(b2, t - 1))) + hp.eps) *
              delta[i];
      md[i] = b1 * md[i] + (1 - b1) * gi;
      vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
      pd[i] -= (k.on_m * md[i] + k.on_g * gi) / (std::sqrt(vd[i] / (1 - std::pow(b2, t))) + hp.eps);
    }
    check_close("dc+nesterov params", p, pd, 1e-6, 1e-5);
  }
}

TEST_CASE("optimizers: same bits for 1, 2 and 3 threads, with and without corrections") {
  Rng rng(26);
  const size_t n = 70001;
  const auto p0 = random_vec(n, rng);
  const auto g = random_vec(n, rng);
  auto run = [&](int threads) {
    Context ctx(threads);
    auto p = p0;
    std::vector<float> m(n, 0.0f), v(n, 0.0f), buf(n, 0.0f);
    AdamWParams a;
    a.weight_decay = 0.1f;
    DelayCorrection nesterov, dc;
    nesterov.kind = DelayCorrectionKind::nesterov;
    dc.kind = DelayCorrectionKind::dc;
    dc.lambda = 2.0f;
    dc.delta = p0.data();
    for (long t = 1; t <= 3; ++t)
      adamw_update(ctx, p.data(), g.data(), m.data(), v.data(), n, a, t);
    adamw_update(ctx, p.data(), g.data(), m.data(), v.data(), n, a, 4, 1.0f, nesterov);
    adamw_update(ctx, p.data(), g.data(), m.data(), v.data(), n, a, 5, 1.0f, dc);
    Secant sec(n);
    for (long t = 6; t <= 8; ++t)  // the pair from update 7 on
      adamw_update(ctx, p.data(), g.data(), m.data(), v.data(), n, a, t, 1.0f,
                   sec.correction(t == 8, p0.data(), t - 5, 0.9f));
    sgd_update(ctx, p.data(), g.data(), buf.data(), n, SGDParams{}, 0.5f);
    sgd_update(ctx, p.data(), g.data(), buf.data(), n, SGDParams{}, 0.5f, nesterov);
    sgd_update(ctx, p.data(), g.data(), buf.data(), n, SGDParams{}, 0.5f,
               sec.correction(true, p0.data(), 4, 0.9f));
    return p;
  };
  const auto r1 = run(1);
  CHECK(bitwise_equal(r1, run(2)));
  CHECK(bitwise_equal(r1, run(3)));
}

TEST_CASE(
    "a fused update (gradient cleared, bf16 copy of the new weights) = update, fill, convert") {
  Rng rng(28);
  const size_t n = 5000;  // several tiles, and a tail
  const auto p0 = random_vec(n, rng);
  const auto g0 = random_vec(n, rng, -2.0f, 2.0f);
  const auto delta = random_vec(n, rng, -1e-2f, 1e-2f);
  DelayCorrection none, nesterov, dc, secant;
  nesterov.kind = DelayCorrectionKind::nesterov;
  dc.kind = DelayCorrectionKind::dc;
  dc.lambda = 2.0f;
  dc.delta = delta.data();
  secant.kind = DelayCorrectionKind::secant;
  secant.lookahead = true;
  secant.delta = delta.data();
  AdamWParams a;
  a.weight_decay = 0.1f;
  SGDParams s;
  s.weight_decay = 0.01f;
  for (int threads = 1; threads <= 3; ++threads)
    for (const DelayCorrection* c : {&none, &nesterov, &dc, &secant})
      for (const bool adamw : {true, false}) {
        CAPTURE(threads);
        CAPTURE(adamw);
        CAPTURE(static_cast<int>(c->kind));
        Context ctx(threads);
        // the state after one plain step, so that the fused step sees non-zero moments
        std::vector<float> pa = p0, sa(2 * n, 0.0f), ga = g0, msa(n, 0.0f);
        Secant seca(n);
        auto step = [&](std::vector<float>& p, std::vector<float>& st, std::vector<float>& g,
                        std::vector<float>& ms, Secant& sec, long t, const DelayCorrection& k,
                        const UpdateOutputs& out) {
          DelayCorrection kk = k;
          kk.mean_square = ms.data();
          kk.step = t;
          kk.secant = SecantState{sec.w.data(), sec.g.data(), sec.num.data(), sec.den.data()};
          kk.secant_pair = t > 1;
          if (adamw)
            adamw_update(ctx, p.data(), g.data(), st.data(), st.data() + n, n, a, t, 0.75f, kk,
                         out);
          else
            sgd_update(ctx, p.data(), g.data(), st.data(), n, s, 0.75f, kk, out);
        };
        step(pa, sa, ga, msa, seca, 1, *c, {});
        std::vector<float> pb = pa, sb = sa, gb = ga, msb = msa;
        Secant secb = seca;
        // separately: the update, a fill, a conversion
        step(pa, sa, ga, msa, seca, 2, *c, {});
        std::fill(ga.begin(), ga.end(), 0.0f);
        std::vector<bf16> ra(n);
        convert_to_bf16(pa.data(), ra.data(), static_cast<int64_t>(n));
        // fused
        std::vector<bf16> rb(n, bf16{0x7fc1});
        step(pb, sb, gb, msb, secb, 2, *c, UpdateOutputs{gb.data(), rb.data()});
        CHECK(bitwise_equal(pa, pb));
        CHECK(bitwise_equal(seca.num, secb.num));
        CHECK(bitwise_equal(seca.w, secb.w));
        CHECK(bitwise_equal(sa, sb));
        CHECK(bitwise_equal(msa, msb));
        CHECK(bitwise_equal(ga, gb));
        CHECK(ra == rb);
      }
  Context ctx(1);
  std::vector<float> p = p0, g = g0, other = g0, m(n), v(n);
  CHECK_THROWS_AS(adamw_update(ctx, p.data(), g.data(), m.data(), v.data(), n, a, 1, 1.0f, {},
                               UpdateOutputs{other.data(), nullptr}),
                  CheckFailure);
}

TEST_CASE("grad_sumsq: accurate, and the same bits for any thread count") {
  Rng rng(27);
  for (size_t n :
       {size_t{0}, size_t{1}, size_t{17}, size_t{16384}, size_t{16385}, size_t{1000003}}) {
    CAPTURE(n);
    auto g = random_vec(n, rng, -3.0f, 3.0f);
    if (n > 10) g[5] = 1e6f;  // a large element among small ones
    long double exact = 0.0L;
    for (float x : g) exact += static_cast<long double>(x) * static_cast<long double>(x);
    Context c1(1), c2(2), c3(3);
    const double s1 = grad_sumsq(c1, g.data(), n);
    CHECK(s1 == doctest::Approx(static_cast<double>(exact)).epsilon(1e-13));
    CHECK(grad_sumsq(c2, g.data(), n) == s1);
    CHECK(grad_sumsq(c3, g.data(), n) == s1);
    CHECK(grad_sumsq(c1, g.data(), n) == s1);
  }
}

TEST_CASE("grad_sumsq adds in its documented order: 8 double lanes per block of 16384") {
  // the order the CUDA backend reproduces; grad_sumsq computes several blocks at once
  Rng rng(28);
  for (size_t n : {size_t{16384} * 4, size_t{16384} * 9 + 5, size_t{16384} * 3 - 1}) {
    CAPTURE(n);
    const auto g = random_vec(n, rng, -3.0f, 3.0f);
    double want = 0.0;
    for (size_t s = 0; s < n; s += 16384) {
      double lanes[8] = {};
      for (size_t i = s; i < std::min(n, s + 16384); ++i) {
        const double x = static_cast<double>(g[i]);
        lanes[(i - s) % 8] += x * x;
      }
      double block = 0.0;
      for (double l : lanes) block += l;
      want += block;
    }
    for (int threads : {1, 2, 3}) {
      Context ctx(threads);
      const double got = grad_sumsq(ctx, g.data(), n);
      CHECK(std::memcmp(&got, &want, sizeof got) == 0);
    }
  }
}

TEST_CASE("clip_scale follows clip_grad_norm_") {
  CHECK(clip_scale(4.0, 1.0) == doctest::Approx(1.0 / (2.0 + 1e-6)));
  CHECK(clip_scale(0.25, 1.0) == 1.0f);
  CHECK(clip_scale(1.0, 1.0) == 1.0f);
  CHECK(clip_scale(100.0, 0.0) == 1.0f);
  CHECK(clip_scale(100.0, -1.0) == 1.0f);
  CHECK(clip_scale(0.0, 1.0) == 1.0f);
}
