// AdamW and SGD element-wise over 16-aligned chunks (bitwise the same for any thread count);
// grad_sumsq over fixed blocks whose double partials are added in block order.
#include "kernels/optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/check.hpp"

namespace actorpipe {

namespace {
constexpr int64_t kAlignElems = 16;
constexpr size_t kSumBlock = size_t{1} << 14;  // elements per grad_sumsq block
constexpr int kDLanes = 8;
}  // namespace

void adamw_update(Context& ctx, float* params, const float* grads, float* m, float* v, size_t n,
                  const AdamWParams& p, long t, float grad_scale) {
  AP_CHECK(t >= 1, "adamw_update: step t = {}, must be >= 1", t);
  // torch.optim.AdamW (single-tensor path): p *= 1 - lr·wd; m = lerp(m, g, 1-β1);
  // v = β2·v + (1-β2)·g²; p -= (lr / bc1) · m / (sqrt(v) / sqrt(bc2) + eps).
  const float b1 = p.beta1, b2 = p.beta2;
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b1), t));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b2), t));
  const float step_size = p.lr / bc1;
  const float bc2_sqrt = std::sqrt(bc2);
  const float decay = 1.0f - p.lr * p.weight_decay;
  const float eps = p.eps;
  ctx.parallel_for_aligned(static_cast<int64_t>(n), kAlignElems, [&](int, int64_t i0, int64_t i1) {
    float* __restrict pp = params;
    const float* __restrict gg = grads;
    float* __restrict mm = m;
    float* __restrict vv = v;
    for (int64_t i = i0; i < i1; ++i) {
      const float g = gg[i] * grad_scale;
      const float pi = pp[i] * decay;
      const float mi = std::fma(1.0f - b1, g - mm[i], mm[i]);
      const float vi = b2 * vv[i] + (1.0f - b2) * (g * g);
      const float denom = std::sqrt(vi) / bc2_sqrt + eps;
      pp[i] = pi - step_size * (mi / denom);
      mm[i] = mi;
      vv[i] = vi;
    }
  });
}

void sgd_update(Context& ctx, float* params, const float* grads, float* momentum_buf, size_t n,
                const SGDParams& p, float grad_scale) {
  const float mu = p.momentum, wd = p.weight_decay, lr = p.lr;
  ctx.parallel_for_aligned(static_cast<int64_t>(n), kAlignElems, [&](int, int64_t i0, int64_t i1) {
    float* __restrict pp = params;
    const float* __restrict gg = grads;
    float* __restrict bb = momentum_buf;
    for (int64_t i = i0; i < i1; ++i) {
      const float d = gg[i] * grad_scale + wd * pp[i];
      const float b = mu * bb[i] + d;
      bb[i] = b;
      pp[i] = pp[i] - lr * b;
    }
  });
}

double grad_sumsq(Context& ctx, const float* grads, size_t n) {
  if (n == 0) return 0.0;
  const size_t nb = (n + kSumBlock - 1) / kSumBlock;
  double* partial = ctx.reduction_buffer(nb);
  ctx.parallel_for(static_cast<int64_t>(nb), [&](int, int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const size_t s = static_cast<size_t>(blk) * kSumBlock;
      const size_t e = std::min(n, s + kSumBlock);
      const float* __restrict g = grads + s;
      const size_t len = e - s;
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
      partial[blk] = sum;
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
