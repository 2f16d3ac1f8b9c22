// Optimizer math on one contiguous parameter buffer: AdamW and SGD with momentum, plus the
// global-norm pieces of gradient clipping. Element-wise, so any partition gives the same bits.
#pragma once

#include <cstddef>

#include "kernels/context.hpp"

namespace actorpipe {

struct AdamWParams {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: p -= lr * wd * p
};

/// One AdamW step at step number t (1-based, for bias correction), as torch.optim.AdamW:
/// p *= 1 − lr·wd; m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²;
/// p −= lr/(1−β1ᵗ) · m / (√v / √(1−β2ᵗ) + eps). grad_scale multiplies
/// the gradient first (clipping). m and v are the moment buffers (same size as params).
void adamw_update(Context& ctx, float* params, const float* grads, float* m, float* v, size_t n,
                  const AdamWParams& p, long t, float grad_scale = 1.0f);

struct SGDParams {
  float lr = 1e-2f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;  // coupled (added to the gradient), as torch.optim.SGD
};

/// buf = momentum·buf + (g + wd·p); p -= lr·buf (buf starts at 0: first step buf = g).
void sgd_update(Context& ctx, float* params, const float* grads, float* momentum_buf, size_t n,
                const SGDParams& p, float grad_scale = 1.0f);

/// Σ g² in double, in a fixed order independent of the thread count (fixed-size blocks,
/// partial sums combined in block order).
double grad_sumsq(Context& ctx, const float* grads, size_t n);

/// The scale that clips a gradient of global norm sqrt(sumsq) to max_norm (1 when under it
/// or when max_norm <= 0); as torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6).
float clip_scale(double sumsq, double max_norm);

}  // namespace actorpipe
