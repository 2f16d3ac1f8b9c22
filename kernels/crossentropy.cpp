// Softmax cross-entropy per row: max, one pass of exp with a fixed-lane sum, one scaling pass.
#include "kernels/crossentropy.hpp"

#include <cmath>
#include <cstring>

#include "kernels/check.hpp"
#include "kernels/internal/vecmath.hpp"

namespace actorpipe {

namespace {

// out[j] = exp(x[j] - max) for the row (out may alias x); returns the sum of out in lane
// order and sets mx to the row max.
float exp_row(float* out, const float* x, int V, float& mx) {
  mx = internal::lane_max(x, V);
  float acc[internal::kLanes] = {};
  int j = 0;
  for (; j + internal::kLanes <= V; j += internal::kLanes)
    for (int l = 0; l < internal::kLanes; ++l) {
      const float e = internal::exp_f32(x[j + l] - mx);
      out[j + l] = e;
      acc[l] += e;
    }
  for (int l = 0; j + l < V; ++l) {
    const float e = internal::exp_f32(x[j + l] - mx);
    out[j + l] = e;
    acc[l] += e;
  }
  float s = 0.0f;
  for (int l = 0; l < internal::kLanes; ++l) s += acc[l];
  return s;
}

void check_target(int32_t tgt, int64_t row, int V) {
  AP_CHECK(tgt >= 0 && tgt < V, "crossentropy: target {} at row {} outside [0, {}) and not {}", tgt,
           row, V, kIgnoreIndex);
}

}  // namespace

int count_targets(const int32_t* targets, int N) {
  int n = 0;
  for (int i = 0; i < N; ++i) n += targets[i] != kIgnoreIndex ? 1 : 0;
  return n;
}

double sum_losses(const float* losses, int N) {
  double s = 0.0;
  for (int i = 0; i < N; ++i) s += static_cast<double>(losses[i]);
  return s;
}

int crossentropy_forward(Context& ctx, float* losses, float* probs, const float* logits,
                         const int32_t* targets, int N, int V) {
  ctx.parallel_for(N, [&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t tgt = targets[r];
      if (tgt == kIgnoreIndex) {
        losses[r] = 0.0f;
        continue;
      }
      check_target(tgt, r, V);
      const float* x = logits + r * V;
      float* p = probs + r * V;
      const float xt = x[tgt];
      float mx = 0.0f;
      const float sum = exp_row(p, x, V, mx);
      losses[r] = std::log(sum) + (mx - xt);
      const float inv = 1.0f / sum;
      float* __restrict pr = p;
      for (int j = 0; j < V; ++j) pr[j] *= inv;
    }
  });
  return count_targets(targets, N);
}

void crossentropy_backward(Context& ctx, float* dlogits, const float* probs, const int32_t* targets,
                           float dloss, int N, int V) {
  ctx.parallel_for(N, [&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t tgt = targets[r];
      float* d = dlogits + r * V;
      if (tgt == kIgnoreIndex) {
        std::memset(d, 0, sizeof(float) * static_cast<size_t>(V));
        continue;
      }
      check_target(tgt, r, V);
      const float* p = probs + r * V;
      const float pt = p[tgt];
      for (int j = 0; j < V; ++j) d[j] = p[j] * dloss;
      d[tgt] = (pt - 1.0f) * dloss;
    }
  });
}

int crossentropy_forward_backward(Context& ctx, float* losses, float* dlogits, const float* logits,
                                  const int32_t* targets, float dloss, int N, int V) {
  ctx.parallel_for(N, [&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t tgt = targets[r];
      float* d = dlogits + r * V;
      if (tgt == kIgnoreIndex) {
        losses[r] = 0.0f;
        std::memset(d, 0, sizeof(float) * static_cast<size_t>(V));
        continue;
      }
      check_target(tgt, r, V);
      const float* x = logits + r * V;
      const float xt = x[tgt];
      float mx = 0.0f;
      const float sum = exp_row(d, x, V, mx);
      losses[r] = std::log(sum) + (mx - xt);
      const float inv = 1.0f / sum;
      const float pt = d[tgt] * inv;
      float* __restrict dr = d;
      for (int j = 0; j < V; ++j) dr[j] = (dr[j] * inv) * dloss;
      d[tgt] = (pt - 1.0f) * dloss;
    }
  });
  return count_targets(targets, N);
}

}  // namespace actorpipe
