// Layer normalisation: per-row statistics with fixed-lane sums; the backward's dweight and
// dbias are summed over rows in order, one channel slice per thread.
#include "kernels/layernorm.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/internal/vecmath.hpp"

namespace actorpipe {

namespace {
constexpr float kEps = 1e-5f;
using internal::kLanes;

// One row's statistics; scalars are parameters so that gcc keeps them in registers and
// vectorises.
void row_stats(float* __restrict mean, float* __restrict rstd, const float* __restrict x,
               const int C) {
  const float m = internal::lane_sum(x, C) / static_cast<float>(C);
  float acc[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= C; c += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const float d = x[c + j] - m;
      acc[j] = std::fma(d, d, acc[j]);
    }
  for (int j = 0; c + j < C; ++j) {
    const float d = x[c + j] - m;
    acc[j] = std::fma(d, d, acc[j]);
  }
  float var = 0.0f;
  for (int j = 0; j < kLanes; ++j) var += acc[j];
  var /= static_cast<float>(C);
  *mean = m;
  *rstd = 1.0f / std::sqrt(var + kEps);
}

// Normalised values of row channels [k0, k0 + n).
void normalise(float* __restrict o, const float* __restrict x, const float* __restrict w,
               const float* __restrict b, const float m, const float s, const int n) {
  for (int k = 0; k < n; ++k) o[k] = std::fma((x[k] - m) * s, w[k], b[k]);
}

void forward_row(float* __restrict o, float* __restrict mean, float* __restrict rstd,
                 const float* __restrict x, const float* __restrict w, const float* __restrict b,
                 const int C) {
  row_stats(mean, rstd, x, C);
  normalise(o, x, w, b, *mean, *rstd, C);
}

// The same with the outputs rounded to bf16, through a block on the stack.
void forward_row(bf16* __restrict o, float* __restrict mean, float* __restrict rstd,
                 const float* __restrict x, const float* __restrict w, const float* __restrict b,
                 const int C) {
  row_stats(mean, rstd, x, C);
  constexpr int kBlock = 256;
  float block[kBlock];
  for (int k = 0; k < C; k += kBlock) {
    const int n = std::min(kBlock, C - k);
    normalise(block, x + k, w + k, b + k, *mean, *rstd, n);
    convert_to_bf16(block, o + k, n);
  }
}

void backward_row(float* __restrict dx, const float* __restrict g, const float* __restrict x,
                  const float* __restrict w, const float m, const float s, const int C) {
  float a1[kLanes] = {};  // Σ w·g
  float a2[kLanes] = {};  // Σ w·g·xhat
  int c = 0;
  for (; c + kLanes <= C; c += kLanes)
    for (int j = 0; j < kLanes; ++j) {
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
  for (int j = 0; j < kLanes; ++j) {
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

// dweight, dbias of channels [0, width) of one row slice.
void param_grad_row(float* __restrict dw, float* __restrict db, const float* __restrict g,
                    const float* __restrict x, const float m, const float s, const int64_t width) {
  for (int64_t k = 0; k < width; ++k) {
    db[k] += g[k];
    dw[k] = std::fma((x[k] - m) * s, g[k], dw[k]);
  }
}
}  // namespace

void layernorm_forward(Context& ctx, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C) {
  ctx.parallel_for(N, [&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      forward_row(out + r * C, mean + r, rstd + r, inp + r * C, weight, bias, C);
  });
}

void layernorm_forward(Context& ctx, bf16* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C) {
  ctx.parallel_for(N, [&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      forward_row(out + r * C, mean + r, rstd + r, inp + r * C, weight, bias, C);
  });
}

void layernorm_backward(Context& ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
  // dinp: rows are independent.
  ctx.parallel_for(N, [&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      backward_row(dinp + r * C, dout + r * C, inp + r * C, weight, mean[r], rstd[r], C);
  });
  // dweight, dbias: one channel slice per chunk, rows in order.
  ctx.parallel_for_aligned(C, 16, [&](int, int64_t c0, int64_t c1) {
    if (c0 == c1) return;
    for (int64_t r = 0; r < N; ++r)
      param_grad_row(dweight + c0, dbias + c0, dout + r * C + c0, inp + r * C + c0, mean[r],
                     rstd[r], c1 - c0);
  });
}

}  // namespace actorpipe
