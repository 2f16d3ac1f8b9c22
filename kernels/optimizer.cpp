// AdamW and SGD element-wise over 16-aligned chunks (bitwise the same for any thread count),
// each chunk in tiles that also clear the gradient and round the new weights while in cache;
// grad_sumsq over fixed blocks whose double partials are added in block order.
#include "kernels/optimizer.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/check.hpp"
#include "kernels/internal/vecmath.hpp"

namespace actorpipe {

namespace {
using internal::kAlignElems;
// Elements per tile of a fused update: its parameters, gradient and two moments (16 KiB) stay
// in the first-level cache between the update and the outputs' writes.
constexpr int64_t kTile = 1024;
constexpr size_t kSumBlock = size_t{1} << 14;  // elements per grad_sumsq block
constexpr int kDLanes = 8;
constexpr float kDcEps = 1e-8f;  // SGD's dc: added to the root of its mean square

struct AdamCoef {
  float b1, b2, step_size, bc2_sqrt, decay, eps, grad_scale;
};

// DC: g += lambda · g² / (√v · inv_sqrt_bc + eps) · delta
struct DcCoef {
  float lambda, inv_sqrt_bc, eps;
};

// Scalars arrive as parameters (not through the closure) so that gcc knows the stores
// cannot change them and vectorises the loop.
// One AdamW element given its gradient gi (already scaled, and corrected by dc).
inline void adamw_element(float& p, float& m, float& v, const float gi, const AdamCoef& c) {
  const float pi = p * c.decay;
  const float mi = std::fma(1.0f - c.b1, gi - m, m);
  const float vi = c.b2 * v + (1.0f - c.b2) * (gi * gi);
  const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
  p = pi - c.step_size * (mi / denom);
  m = mi;
  v = vi;
}

void adamw_range(float* __restrict p, const float* __restrict g, float* __restrict m,
                 float* __restrict v, int64_t n, const AdamCoef c) {
  for (int64_t i = 0; i < n; ++i) adamw_element(p[i], m[i], v[i], g[i] * c.grad_scale, c);
}

// One NAdam element (Nesterov's look-ahead) given its gradient gi.
inline void nadam_element(float& p, float& m, float& v, const float gi, const AdamCoef& c,
                          const NadamSteps& k) {
  const float pi = p * c.decay;
  const float mi = std::fma(1.0f - c.b1, gi - m, m);
  const float vi = c.b2 * v + (1.0f - c.b2) * (gi * gi);
  const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
  p = pi - (k.on_m * mi + k.on_g * gi) / denom;
  m = mi;
  v = vi;
}

template <bool kLookahead>
inline void adamw_step(float& p, float& m, float& v, const float gi, const AdamCoef& c,
                       const NadamSteps& k) {
  if constexpr (kLookahead)
    nadam_element(p, m, v, gi, c, k);
  else
    adamw_element(p, m, v, gi, c);
}

// dc's corrected gradient: g0 + λ·g0²/(√ms·inv_sqrt_bc + eps)·Δ
inline float dc_gradient(const float g0, const float ms, const float delta, const DcCoef& k) {
  return g0 + k.lambda * (g0 * g0) / (std::sqrt(ms) * k.inv_sqrt_bc + k.eps) * delta;
}

// secant's corrected gradient of an element at weights w with gradient g0 computed at w − d;
// records the pair (dx, dg) against the previous gradient when kPair, then that gradient.
template <bool kPair>
inline float secant_gradient(const float g0, const float w, const float d, float& s, float& gp,
                             float& num, float& den, const float rho) {
  const float ws = w - d;
  float gi = g0;
  if constexpr (kPair) {
    const float dx = ws - s;
    const float dg = g0 - gp;
    const float ni = rho * num + (1.0f - rho) * (dg * dx);
    const float di = rho * den + (1.0f - rho) * (dx * dx);
    // den = 0 only where every dx so far was 0, and num with it: h = 0 there. The division is
    // unconditional (by at least FLT_MIN) so that the loop vectorises.
    const float h = std::max(0.0f, ni / std::max(di, FLT_MIN));
    gi = g0 + h * d;
    num = ni;
    den = di;
  }
  s = ws;
  gp = g0;
  return gi;
}

void adamw_nesterov_range(float* __restrict p, const float* __restrict g, float* __restrict m,
                          float* __restrict v, int64_t n, const AdamCoef c, const NadamSteps k) {
  for (int64_t i = 0; i < n; ++i) nadam_element(p[i], m[i], v[i], g[i] * c.grad_scale, c, k);
}

template <bool kLookahead>
void adamw_dc_range(float* __restrict p, const float* __restrict g, float* __restrict m,
                    float* __restrict v, const float* __restrict delta, int64_t n, const AdamCoef c,
                    const DcCoef k, const NadamSteps ks) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = dc_gradient(g[i] * c.grad_scale, v[i], delta[i], k);
    adamw_step<kLookahead>(p[i], m[i], v[i], gi, c, ks);
  }
}

// kDelta false: nothing stale (Δ = 0, delta is not read)
// The state's arrays are parameters of their own, each __restrict, and the loop is not inlined
// into its caller: so gcc vectorises it (inlined into the tile loop's lambda it did not, losing
// the pointers' __restrict among nine streams).
template <bool kLookahead, bool kPair, bool kDelta>
[[gnu::noinline]] void adamw_secant_range(float* __restrict p, const float* __restrict g,
                                          float* __restrict m, float* __restrict v,
                                          const float* __restrict delta, float* __restrict s,
                                          float* __restrict gp, float* __restrict num,
                                          float* __restrict den, int64_t n, const AdamCoef c,
                                          const float rho, const NadamSteps ks) {
  for (int64_t i = 0; i < n; ++i) {
    float d = 0.0f;
    if constexpr (kDelta) d = delta[i];
    const float gi =
        secant_gradient<kPair>(g[i] * c.grad_scale, p[i], d, s[i], gp[i], num[i], den[i], rho);
    adamw_step<kLookahead>(p[i], m[i], v[i], gi, c, ks);
  }
}

// One SGD element given its gradient gi (already scaled and corrected); kNesterov: torch's
// nesterov=True.
template <bool kNesterov>
inline void sgd_element(float& p, float& buf, const float gi, const float mu, const float wd,
                        const float lr) {
  const float d = gi + wd * p;
  const float b = mu * buf + d;
  buf = b;
  if constexpr (kNesterov)
    p = p - lr * (d + mu * b);
  else
    p = p - lr * b;
}

template <bool kNesterov>
void sgd_range(float* __restrict p, const float* __restrict g, float* __restrict buf, int64_t n,
               const float mu, const float wd, const float lr, const float grad_scale) {
  for (int64_t i = 0; i < n; ++i)
    sgd_element<kNesterov>(p[i], buf[i], g[i] * grad_scale, mu, wd, lr);
}

template <bool kNesterov>
void sgd_dc_range(float* __restrict p, const float* __restrict g, float* __restrict buf,
                  float* __restrict ms, const float* __restrict delta, int64_t n, const float mu,
                  const float wd, const float lr, const float grad_scale, const DcCoef k,
                  const float ms_decay) {
  for (int64_t i = 0; i < n; ++i) {
    const float g0 = g[i] * grad_scale;
    const float gi = delta != nullptr ? dc_gradient(g0, ms[i], delta[i], k) : g0;
    ms[i] = ms_decay * ms[i] + (1.0f - ms_decay) * (g0 * g0);
    sgd_element<kNesterov>(p[i], buf[i], gi, mu, wd, lr);
  }
}

template <bool kNesterov, bool kPair, bool kDelta>
[[gnu::noinline]] void sgd_secant_range(float* __restrict p, const float* __restrict g,
                                        float* __restrict buf, const float* __restrict delta,
                                        float* __restrict s, float* __restrict gp,
                                        float* __restrict num, float* __restrict den, int64_t n,
                                        const float mu, const float wd, const float lr,
                                        const float grad_scale, const float rho) {
  for (int64_t i = 0; i < n; ++i) {
    float d = 0.0f;
    if constexpr (kDelta) d = delta[i];
    const float gi =
        secant_gradient<kPair>(g[i] * grad_scale, p[i], d, s[i], gp[i], num[i], den[i], rho);
    sgd_element<kNesterov>(p[i], buf[i], gi, mu, wd, lr);
  }
}

double sumsq_block(const float* __restrict g, size_t len) {
  double acc[kDLanes] = {};
  size_t i = 0;
  for (; i + kDLanes <= len; i += kDLanes)
    for (int j = 0; j < kDLanes; ++j) {
      const double x = static_cast<double>(g[i + static_cast<size_t>(j)]);
      acc[j] += x * x;
    }
  for (int j = 0; i + static_cast<size_t>(j) < len; ++j) {
    const double x = static_cast<double>(g[i + static_cast<size_t>(j)]);
    acc[j] += x * x;
  }
  double sum = 0.0;
  for (int j = 0; j < kDLanes; ++j) sum += acc[j];
  return sum;
}

// sumsq_block of kSumGroup whole blocks at once: each block's lanes add in sumsq_block's order
// (the same bits), the blocks' chains of additions interleaved so that they overlap.
constexpr int kSumGroup = 4;
void sumsq_full_blocks(double* __restrict partial, const float* __restrict g) {
  double acc[kSumGroup][kDLanes] = {};
  for (size_t i = 0; i < kSumBlock; i += kDLanes)
    for (int b = 0; b < kSumGroup; ++b)
      for (int j = 0; j < kDLanes; ++j) {
        const double x =
            static_cast<double>(g[static_cast<size_t>(b) * kSumBlock + i + static_cast<size_t>(j)]);
        acc[b][j] += x * x;
      }
  for (int b = 0; b < kSumGroup; ++b) {
    double sum = 0.0;
    for (int j = 0; j < kDLanes; ++j) sum += acc[b][j];
    partial[b] = sum;
  }
}

// Runs update(b, e) over the tiles of [i0, i1) of a buffer whose parameters start at `params`,
// each tile followed by its outputs (UpdateOutputs) while it is in cache.
template <class Update>
void update_tiles(const float* params, int64_t i0, int64_t i1, const UpdateOutputs& out,
                  const Update& update) {
  if (out.clear == nullptr && out.rounded == nullptr) {
    update(i0, i1);
    return;
  }
  for (int64_t b = i0; b < i1; b += kTile) {
    const int64_t e = std::min(i1, b + kTile);
    update(b, e);
    if (out.clear != nullptr)
      std::memset(out.clear + b, 0, static_cast<size_t>(e - b) * sizeof(float));
    if (out.rounded != nullptr) convert_to_bf16(params + b, out.rounded + b, e - b);
  }
}

// f(std::bool_constant<a>, std::bool_constant<b>, std::bool_constant<c>): a loop instantiated
// for the run-time flags
template <class F>
void with_flags(bool a, bool b, bool c, const F& f) {
  auto with_c = [&](auto ta, auto tb) {
    c ? f(ta, tb, std::true_type{}) : f(ta, tb, std::false_type{});
  };
  auto with_b = [&](auto ta) { b ? with_c(ta, std::true_type{}) : with_c(ta, std::false_type{}); };
  a ? with_b(std::true_type{}) : with_b(std::false_type{});
}

// Whether the update takes Nesterov's look-ahead: nesterov, or a compensation with it.
bool takes_lookahead(const DelayCorrection& dc) {
  return dc.kind == DelayCorrectionKind::nesterov ||
         (dc.lookahead &&
          (dc.kind == DelayCorrectionKind::dc || dc.kind == DelayCorrectionKind::secant));
}

void check_secant(const SecantState& st, const char* who) {
  AP_CHECK(st.weights != nullptr && st.grad != nullptr && st.num != nullptr && st.den != nullptr,
           "{} with the secant correction: needs its state (previous weights and gradient, the "
           "running means)",
           who);
}

}  // namespace

// 1/√(1 − decay^k), the inverse root of a bias correction (k ≥ 1).
float inv_sqrt_bias(float decay, long k) {
  return 1.0f / std::sqrt(1.0f - static_cast<float>(std::pow(static_cast<double>(decay), k)));
}

NadamSteps nadam_steps(float lr, float beta1, long t, float momentum_decay) {
  AP_CHECK(t >= 1 && momentum_decay >= 0.0f, "nadam_steps: t = {}, momentum_decay = {}", t,
           momentum_decay);
  const double b1 = static_cast<double>(beta1), rate = static_cast<double>(lr);
  if (momentum_decay == 0.0f) {
    return {static_cast<float>(rate * b1 / (1.0 - std::pow(b1, t + 1))),
            static_cast<float>(rate * (1.0 - b1) / (1.0 - std::pow(b1, t)))};
  }
  const double psi = static_cast<double>(momentum_decay);
  auto mu = [&](long i) { return b1 * (1.0 - 0.5 * std::pow(0.96, static_cast<double>(i) * psi)); };
  // Π_{i<=t} μ_i, multiplied in update order. Every layer's update of a step asks for the same
  // t, and the next step for t + 1: the thread keeps the product it reached and goes on from
  // there (the same multiplications in the same order, so the same bits as from 1).
  struct Product {
    double b1 = -1.0, psi = -1.0;
    long t = 0;
    double value = 1.0;
  };
  thread_local Product product;
  if (product.b1 != b1 || product.psi != psi || product.t > t) product = {b1, psi, 0, 1.0};
  for (; product.t < t; ++product.t) product.value *= mu(product.t + 1);
  const double mu_t = mu(t), mu_next = mu(t + 1);
  return {static_cast<float>(rate * mu_next / (1.0 - product.value * mu_next)),
          static_cast<float>(rate * (1.0 - mu_t) / (1.0 - product.value))};
}

void adamw_update(Context& ctx, float* params, const float* grads, float* m, float* v, size_t n,
                  const AdamWParams& p, long t, float grad_scale, const DelayCorrection& dc,
                  const UpdateOutputs& out) {
  AP_CHECK(t >= 1, "adamw_update: step t = {}, must be >= 1", t);
  AP_CHECK(out.clear == nullptr || out.clear == grads,
           "adamw_update: the gradient to clear must be the one it reads");
  // torch.optim.AdamW (single-tensor path): p *= 1 - lr·wd; m = lerp(m, g, 1-β1);
  // v = β2·v + (1-β2)·g²; p -= (lr / bc1) · m / (sqrt(v) / sqrt(bc2) + eps).
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(p.beta1), t));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(p.beta2), t));
  const AdamCoef c{p.beta1, p.beta2,   p.lr / bc1, std::sqrt(bc2), 1.0f - p.lr * p.weight_decay,
                   p.eps,   grad_scale};
  const int64_t len = static_cast<int64_t>(n);
  // the loop over [i0, i1) of the rule in force, through update_tiles
  auto over = [&](const auto& range) {
    ctx.parallel_for_aligned(len, kAlignElems, [&](int, int64_t i0, int64_t i1) {
      update_tiles(params, i0, i1, out, range);
    });
  };
  const bool lookahead = takes_lookahead(dc);
  const NadamSteps ks = lookahead ? nadam_steps(p.lr, p.beta1, t, dc.momentum_decay) : NadamSteps{};
  if (dc.kind == DelayCorrectionKind::secant) {
    check_secant(dc.secant, "adamw_update");
    const float rho = dc.secant_decay;
    const SecantState& st = dc.secant;
    with_flags(lookahead, dc.secant_pair, dc.delta != nullptr, [&](auto look, auto pair, auto d) {
      over([&](int64_t b, int64_t e) {
        adamw_secant_range<decltype(look)::value, decltype(pair)::value, decltype(d)::value>(
            params + b, grads + b, m + b, v + b, dc.delta != nullptr ? dc.delta + b : nullptr,
            st.weights + b, st.grad + b, st.num + b, st.den + b, e - b, c, rho, ks);
      });
    });
    return;
  }
  if (dc.kind == DelayCorrectionKind::dc && dc.delta != nullptr && t > 1) {
    const DcCoef k{dc.lambda, inv_sqrt_bias(p.beta2, t - 1), p.eps};
    over([&](int64_t b, int64_t e) {
      if (lookahead)
        adamw_dc_range<true>(params + b, grads + b, m + b, v + b, dc.delta + b, e - b, c, k, ks);
      else
        adamw_dc_range<false>(params + b, grads + b, m + b, v + b, dc.delta + b, e - b, c, k, ks);
    });
    return;
  }
  if (lookahead) {  // nesterov, or dc's look-ahead where nothing is stale
    over([&](int64_t b, int64_t e) {
      adamw_nesterov_range(params + b, grads + b, m + b, v + b, e - b, c, ks);
    });
    return;
  }
  over([&](int64_t b, int64_t e) { adamw_range(params + b, grads + b, m + b, v + b, e - b, c); });
}

void xpipe_predict(Context& ctx, float* out, const float* w, const float* m, const float* v,
                   size_t n, const WeightPrediction& p) {
  if (n == 0) return;
  const float k = p.k, bc1 = p.bc1, bc2_sqrt = p.bc2_sqrt, eps = p.eps, wd = p.wd;
  float* __restrict y = out;
  const float* __restrict wr = w;
  const float* __restrict mr = m;
  const float* __restrict vr = v;
  ctx.parallel_for_aligned(static_cast<int64_t>(n), 16, [&](int, int64_t i0, int64_t i1) {
    if (vr != nullptr) {
      for (int64_t i = i0; i < i1; ++i) {
        const float denom = std::sqrt(vr[i]) / bc2_sqrt + eps;
        y[i] = wr[i] - k * ((mr[i] / bc1) / denom + wd * wr[i]);
      }
    } else {
      for (int64_t i = i0; i < i1; ++i) y[i] = wr[i] - k * mr[i];
    }
  });
}

void sgd_update(Context& ctx, float* params, const float* grads, float* momentum_buf, size_t n,
                const SGDParams& p, float grad_scale, const DelayCorrection& dc,
                const UpdateOutputs& out) {
  AP_CHECK(out.clear == nullptr || out.clear == grads,
           "sgd_update: the gradient to clear must be the one it reads");
  const int64_t len = static_cast<int64_t>(n);
  auto over = [&](const auto& range) {
    ctx.parallel_for_aligned(len, kAlignElems, [&](int, int64_t i0, int64_t i1) {
      update_tiles(params, i0, i1, out, range);
    });
  };
  const bool nesterov = takes_lookahead(dc);
  const float mu = p.momentum, wd = p.weight_decay, lr = p.lr;
  if (dc.kind == DelayCorrectionKind::secant) {
    check_secant(dc.secant, "sgd_update");
    const float rho = dc.secant_decay;
    const SecantState& st = dc.secant;
    with_flags(nesterov, dc.secant_pair, dc.delta != nullptr, [&](auto look, auto pair, auto d) {
      over([&](int64_t b, int64_t e) {
        sgd_secant_range<decltype(look)::value, decltype(pair)::value, decltype(d)::value>(
            params + b, grads + b, momentum_buf + b, dc.delta != nullptr ? dc.delta + b : nullptr,
            st.weights + b, st.grad + b, st.num + b, st.den + b, e - b, mu, wd, lr, grad_scale,
            rho);
      });
    });
    return;
  }
  if (dc.kind == DelayCorrectionKind::dc) {
    AP_CHECK(dc.mean_square != nullptr && dc.step >= 1,
             "sgd_update with dc: needs its mean square and the step (got step {})", dc.step);
    // without a delta (nothing stale) or at step 1 the correction is 0; the mean square still
    // takes the gradient
    const bool on = dc.delta != nullptr && dc.step > 1;
    const DcCoef k{dc.lambda, on ? inv_sqrt_bias(dc.ms_decay, dc.step - 1) : 1.0f, kDcEps};
    over([&](int64_t b, int64_t e) {
      const float* d = on ? dc.delta + b : nullptr;
      if (nesterov)
        sgd_dc_range<true>(params + b, grads + b, momentum_buf + b, dc.mean_square + b, d, e - b,
                           mu, wd, lr, grad_scale, k, dc.ms_decay);
      else
        sgd_dc_range<false>(params + b, grads + b, momentum_buf + b, dc.mean_square + b, d, e - b,
                            mu, wd, lr, grad_scale, k, dc.ms_decay);
    });
    return;
  }
  over([&](int64_t b, int64_t e) {
    if (nesterov)
      sgd_range<true>(params + b, grads + b, momentum_buf + b, e - b, mu, wd, lr, grad_scale);
    else
      sgd_range<false>(params + b, grads + b, momentum_buf + b, e - b, mu, wd, lr, grad_scale);
  });
}

double grad_sumsq(Context& ctx, const float* grads, size_t n) {
  if (n == 0) return 0.0;
  const size_t nb = (n + kSumBlock - 1) / kSumBlock;
  double* partial = ctx.reduction_buffer(nb);
  ctx.parallel_for(static_cast<int64_t>(nb), [&](int, int64_t b0, int64_t b1) {
    int64_t blk = b0;
    for (; blk + kSumGroup <= b1 && static_cast<size_t>(blk + kSumGroup) * kSumBlock <= n;
         blk += kSumGroup)
      sumsq_full_blocks(partial + blk, grads + static_cast<size_t>(blk) * kSumBlock);
    for (; blk < b1; ++blk) {
      const size_t s = static_cast<size_t>(blk) * kSumBlock;
      partial[blk] = sumsq_block(grads + s, std::min(n, s + kSumBlock) - s);
    }
  });
  double total = 0.0;
  for (size_t b = 0; b < nb; ++b) total += partial[b];
  return total;
}

float clip_scale(double sumsq, double max_norm) {
  if (max_norm <= 0.0) return 1.0f;
  const double norm = std::sqrt(sumsq);
  if (!(norm > max_norm)) return 1.0f;
  return static_cast<float>(max_norm / (norm + 1e-6));
}

}  // namespace actorpipe
