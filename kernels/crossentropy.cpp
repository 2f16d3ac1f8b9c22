// Softmax cross-entropy per row: max, one pass of exp with a fixed-lane sum, one scaling pass.
#include "kernels/crossentropy.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/check.hpp"
#include "kernels/internal/vecmath.hpp"

namespace actorpipe {

namespace {
using internal::kLanes;

// out[j] = exp(x[j] - mx); returns Σ out in lane order. Two copies of the loop: in place
// (one restrict pointer) and out of place (two), so that both vectorise without alias checks.
float exp_row_inplace(float* __restrict p, const int V, const float mx) {
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= V; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float e = internal::exp_f32(p[j + l] - mx);
      p[j + l] = e;
      acc[l] += e;
    }
  for (int l = 0; j + l < V; ++l) {
    const float e = internal::exp_f32(p[j + l] - mx);
    p[j + l] = e;
    acc[l] += e;
  }
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

float exp_row_copy(float* __restrict out, const float* __restrict x, const int V, const float mx) {
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= V; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
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
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// Σ exp(x[j] - mx) in lane order, the sum exp_row_copy returns (nothing stored).
float exp_sum_row(const float* __restrict x, const int V, const float mx) {
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= V; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += internal::exp_f32(x[j + l] - mx);
  for (int l = 0; j + l < V; ++l) acc[l] += internal::exp_f32(x[j + l] - mx);
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

void scale_row(float* __restrict p, const float s, const int V) {
  for (int j = 0; j < V; ++j) p[j] *= s;
}

// d = (e · inv) · dloss.
void scale2_row(float* __restrict p, const float inv, const float dloss, const int V) {
  for (int j = 0; j < V; ++j) p[j] = (p[j] * inv) * dloss;
}

void mul_row(float* __restrict d, const float* __restrict p, const float dloss, const int V) {
  for (int j = 0; j < V; ++j) d[j] = p[j] * dloss;
}

void check_target(int32_t tgt, int64_t row, int V) {
  AP_CHECK(tgt >= 0 && tgt < V, "crossentropy: target {} at row {} outside [0, {}) and not {}", tgt,
           row, V, kIgnoreIndex);
}

// The loss kernels' row loop, over the Context's threads: a row whose target is kIgnoreIndex
// gets loss 0 and ignored(r); any other has its target checked and losses[r] =
// counted(chunk, r, target). Returns the number of counted rows.
template <class Counted, class Ignored>
int each_row(Context& ctx, float* losses, const int32_t* targets, int N, int V, Counted&& counted,
             Ignored&& ignored) {
  ctx.parallel_for(N, [&](int chunk, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t tgt = targets[r];
      if (tgt == kIgnoreIndex) {
        losses[r] = 0.0f;
        ignored(r);
        continue;
      }
      check_target(tgt, r, V);
      losses[r] = counted(chunk, r, tgt);
    }
  });
  return count_targets(targets, N);
}

// out (row of V) = exp(x - max); returns the sum, sets mx. out may alias x.
float exp_row(float* out, const float* x, int V, float& mx) {
  mx = internal::lane_max(x, V);
  return out == x ? exp_row_inplace(out, V, mx) : exp_row_copy(out, x, V, mx);
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
  return each_row(
      ctx, losses, targets, N, V,
      [&](int, int64_t r, int32_t tgt) {
        const float* x = logits + r * V;
        float* p = probs + r * V;
        const float xt = x[tgt];
        float mx = 0.0f;
        const float sum = exp_row(p, x, V, mx);
        scale_row(p, 1.0f / sum, V);
        return std::log(sum) + (mx - xt);
      },
      [](int64_t) {});
}

namespace {
// The losses alone, each row's largest logit and exponentials' sum handed to keep(r, max, sum).
template <class Keep>
int loss_rows(Context& ctx, float* losses, const float* logits, const int32_t* targets, int N,
              int V, Keep&& keep) {
  return each_row(
      ctx, losses, targets, N, V,
      [&](int, int64_t r, int32_t tgt) {
        const float* x = logits + r * V;
        const float mx = internal::lane_max(x, V);
        const float sum = exp_sum_row(x, V, mx);
        keep(r, mx, sum);
        return std::log(sum) + (mx - x[tgt]);
      },
      [](int64_t) {});
}
}  // namespace

int crossentropy_losses(Context& ctx, float* losses, float* stats, const float* logits,
                        const int32_t* targets, int N, int V) {
  return loss_rows(ctx, losses, logits, targets, N, V, [stats](int64_t r, float mx, float sum) {
    stats[2 * r] = mx;
    stats[2 * r + 1] = sum;
  });
}

int crossentropy_losses(Context& ctx, float* losses, const float* logits, const int32_t* targets,
                        int N, int V) {
  return loss_rows(ctx, losses, logits, targets, N, V, [](int64_t, float, float) {});
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
      if (d == p) {
        scale_row(d, dloss, V);
      } else {
        mul_row(d, p, dloss, V);
      }
      d[tgt] = (pt - 1.0f) * dloss;
    }
  });
}

namespace {
// One row of crossentropy_forward_backward: its loss, and d (V floats, may alias x) = the
// row's dlogits.
float loss_and_gradient_row(float* d, const float* x, int32_t tgt, float dloss, int V) {
  const float xt = x[tgt];
  float mx = 0.0f;
  const float sum = exp_row(d, x, V, mx);
  const float loss = std::log(sum) + (mx - xt);
  const float inv = 1.0f / sum;
  const float pt = d[tgt] * inv;
  scale2_row(d, inv, dloss, V);
  d[tgt] = (pt - 1.0f) * dloss;
  return loss;
}
}  // namespace

int crossentropy_forward_backward(Context& ctx, float* losses, float* dlogits, const float* logits,
                                  const int32_t* targets, float dloss, int N, int V) {
  return each_row(
      ctx, losses, targets, N, V,
      [&](int, int64_t r, int32_t tgt) {
        return loss_and_gradient_row(dlogits + r * V, logits + r * V, tgt, dloss, V);
      },
      [&](int64_t r) { std::memset(dlogits + r * V, 0, sizeof(float) * static_cast<size_t>(V)); });
}

int crossentropy_forward_backward(Context& ctx, float* losses, bf16* dlogits, const float* logits,
                                  const int32_t* targets, float dloss, int N, int V) {
  // each chunk's row in f32, rounded into dlogits while it is in cache
  float* rows = ctx.arena().alloc_f32(static_cast<size_t>(ctx.threads()) * V);
  return each_row(
      ctx, losses, targets, N, V,
      [&](int chunk, int64_t r, int32_t tgt) {
        float* d = rows + static_cast<int64_t>(chunk) * V;
        const float loss = loss_and_gradient_row(d, logits + r * V, tgt, dloss, V);
        convert_to_bf16(d, dlogits + r * V, V);
        return loss;
      },
      [&](int64_t r) { std::fill_n(dlogits + r * V, V, bf16{}); });  // to_bf16(0.0f)
}

namespace {
// One row of dlogits from its stats (loss_and_gradient_row's values): through a block of f32 on
// the stack, stored by `store(block, at, n)`.
template <class Store>
void gradient_row(const float* __restrict x, const float mx, const float inv, const int32_t tgt,
                  const float dloss, const int V, Store&& store) {
  constexpr int kBlock = 256;
  float block[kBlock];
  for (int j0 = 0; j0 < V; j0 += kBlock) {
    const int n = std::min(kBlock, V - j0);
    for (int j = 0; j < n; ++j) block[j] = (internal::exp_f32(x[j0 + j] - mx) * inv) * dloss;
    if (tgt >= j0 && tgt < j0 + n)
      block[tgt - j0] = (internal::exp_f32(x[tgt] - mx) * inv - 1.0f) * dloss;
    store(block, j0, n);
  }
}

template <class T, class Store, class Zero>
void backward_from_stats(Context& ctx, T* dlogits, const float* stats, const float* logits,
                         const int32_t* targets, float dloss, int N, int V, Store&& store,
                         Zero&& zero) {
  ctx.parallel_for(N, [&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t tgt = targets[r];
      T* d = dlogits + r * V;
      if (tgt == kIgnoreIndex) {
        zero(d);
        continue;
      }
      check_target(tgt, r, V);
      const float inv = 1.0f / stats[2 * r + 1];
      gradient_row(logits + r * V, stats[2 * r], inv, tgt, dloss, V,
                   [&](const float* b, int at, int n) { store(b, d + at, n); });
    }
  });
}
}  // namespace

void crossentropy_backward(Context& ctx, float* dlogits, const float* stats, const float* logits,
                           const int32_t* targets, float dloss, int N, int V) {
  backward_from_stats(
      ctx, dlogits, stats, logits, targets, dloss, N, V,
      [](const float* b, float* d, int n) {
        std::memcpy(d, b, sizeof(float) * static_cast<size_t>(n));
      },
      [V](float* d) { std::memset(d, 0, sizeof(float) * static_cast<size_t>(V)); });
}

void crossentropy_backward(Context& ctx, bf16* dlogits, const float* stats, const float* logits,
                           const int32_t* targets, float dloss, int N, int V) {
  backward_from_stats(
      ctx, dlogits, stats, logits, targets, dloss, N, V,
      [](const float* b, bf16* d, int n) { convert_to_bf16(b, d, n); },
      [V](bf16* d) { std::fill_n(d, V, bf16{}); });  // to_bf16(0.0f)
}

}  // namespace actorpipe
