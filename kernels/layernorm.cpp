// Layer normalisation: per-row statistics with fixed-lane sums; the backward's dweight and
// dbias are summed over rows in order, one channel slice per thread.
#include "kernels/layernorm.hpp"

#include <cmath>

#include "kernels/internal/vecmath.hpp"

namespace actorpipe {

namespace {
constexpr float kEps = 1e-5f;
}

void layernorm_forward(Context& ctx, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C) {
  ctx.parallel_for(N, [&](int, int64_t r0, int64_t r1) {
    const float* __restrict w = weight;
    const float* __restrict bi = bias;
    for (int64_t r = r0; r < r1; ++r) {
      const float* __restrict x = inp + r * C;
      float* __restrict o = out + r * C;
      const float m = internal::lane_sum(x, C) / static_cast<float>(C);
      // Centered second pass (the row is in L1).
      float acc[internal::kLanes] = {};
      int c = 0;
      for (; c + internal::kLanes <= C; c += internal::kLanes)
        for (int j = 0; j < internal::kLanes; ++j) {
          const float d = x[c + j] - m;
          acc[j] = std::fma(d, d, acc[j]);
        }
      for (int j = 0; c + j < C; ++j) {
        const float d = x[c + j] - m;
        acc[j] = std::fma(d, d, acc[j]);
      }
      float var = 0.0f;
      for (int j = 0; j < internal::kLanes; ++j) var += acc[j];
      var /= static_cast<float>(C);
      const float s = 1.0f / std::sqrt(var + kEps);
      for (int k = 0; k < C; ++k) o[k] = std::fma((x[k] - m) * s, w[k], bi[k]);
      mean[r] = m;
      rstd[r] = s;
    }
  });
}

void layernorm_backward(Context& ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  // dinp: rows are independent.
  ctx.parallel_for(N, [&](int, int64_t r0, int64_t r1) {
    const float* __restrict w = weight;
    for (int64_t r = r0; r < r1; ++r) {
      const float* __restrict x = inp + r * C;
      const float* __restrict g = dout + r * C;
      float* __restrict dx = dinp + r * C;
      const float m = mean[r];
      const float s = rstd[r];
      float a1[internal::kLanes] = {};  // Σ w·g
      float a2[internal::kLanes] = {};  // Σ w·g·xhat
      int c = 0;
      for (; c + internal::kLanes <= C; c += internal::kLanes)
        for (int j = 0; j < internal::kLanes; ++j) {
          const float dn = w[c + j] * g[c + j];
          a1[j] += dn;
          a2[j] = std::fma(dn, (x[c + j] - m) * s, a2[j]);
        }
      for (int j = 0; c + j < C; ++j) {
        const float dn = w[c + j] * g[c + j];
        a1[j] += dn;
        a2[j] = std::fma(dn, (x[c + j] - m) * s, a2[j]);
      }
      float sum1 = 0.0f, sum2 = 0.0f;
      for (int j = 0; j < internal::kLanes; ++j) {
        sum1 += a1[j];
        sum2 += a2[j];
      }
      const float mean1 = sum1 / static_cast<float>(C);
      const float mean2 = sum2 / static_cast<float>(C);
      for (int k = 0; k < C; ++k) {
        const float xhat = (x[k] - m) * s;
        const float dn = w[k] * g[k];
        dx[k] = std::fma(dn - mean1 - xhat * mean2, s, dx[k]);
      }
    }
  });
  // dweight, dbias: one channel slice per chunk, rows in order.
  ctx.parallel_for_aligned(C, 16, [&](int, int64_t c0, int64_t c1) {
    if (c0 == c1) return;
    const int64_t wdt = c1 - c0;
    float* __restrict dw = dweight + c0;
    float* __restrict db = dbias + c0;
    for (int64_t r = 0; r < N; ++r) {
      const float* __restrict x = inp + r * C + c0;
      const float* __restrict g = dout + r * C + c0;
      const float m = mean[r];
      const float s = rstd[r];
      for (int64_t k = 0; k < wdt; ++k) {
        db[k] += g[k];
        dw[k] = std::fma((x[k] - m) * s, g[k], dw[k]);
      }
    }
  });
}

}  // namespace actorpipe
