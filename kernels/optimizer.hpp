// Optimizer math on one contiguous parameter buffer: AdamW and SGD with momentum, plus the
// global-norm pieces of gradient clipping. Element-wise, so any partition gives the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/bf16.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

/// What an update writes besides the parameters and its state, in the same pass over the
/// buffer (a tile of it at a time, while the tile is in cache), instead of separate passes:
///  clear    the gradient the update reads (the same floats as its `grads`), zeroed once read,
///           ready for the next step's accumulation; nullptr = left as it is
///  rounded  n bf16 values: the new parameters' bf16 rounding (to_bf16), the copy a bf16
///           product reads; nullptr = none
/// The parameters, state and these outputs are the bits of the update followed by a fill with
/// zeros and convert_to_bf16.
struct UpdateOutputs {
  float* clear = nullptr;
  bf16* rounded = nullptr;
};

/// A correction of an update whose gradient was computed at stale weights (docs/modes.md,
/// "Delay corrections"); `none` is the plain rule.
///  nesterov  Nesterov look-ahead (NAdam for AdamW, Nesterov momentum for SGD): the update
///            leans on the momentum it is about to have.
///  dc        delay compensation (DC-ASGD): g ← g + λ·g²/(√ms + eps)·Δ, a diagonal estimate of
///            the Hessian times Δ = W_now − W_stale, the weights' change since the gradient's
///            weights; ms is AdamW's second moment before this update (bias-corrected), or for
///            SGD a mean square of its own kept with decay `ms_decay`.
///  secant    delay compensation with a secant estimate of the Hessian's diagonal:
///            g ← g + h·Δ, h = max(0, num/den), where num and den are running means (decay
///            `secant_decay`) of dg·dx and dx² over consecutive updates, dx the change of the
///            gradients' weights and dg the change of the gradients (SecantState).
/// dc and secant take Nesterov's look-ahead as well with `lookahead` (kind nesterov is the
/// look-ahead alone).
enum class DelayCorrectionKind : uint8_t { none, nesterov, dc, secant };

/// What the secant correction keeps between updates, n floats each (starting zeroed):
///  weights  the weights the previous gradient was computed at (W_now − Δ of that update)
///  grad     the previous gradient (after grad_scale, before any correction)
///  num, den the running means of dg·dx and dx²
struct SecantState {
  float* weights = nullptr;
  float* grad = nullptr;
  float* num = nullptr;
  float* den = nullptr;
};

struct DelayCorrection {
  DelayCorrectionKind kind = DelayCorrectionKind::none;
  bool lookahead = false;        ///< dc, secant: also Nesterov's look-ahead (as kind nesterov)
  float lambda = 0.0f;           ///< dc: λ
  const float* delta = nullptr;  ///< dc, secant: Δ, n floats; nullptr = nothing stale (Δ = 0)
  float* mean_square = nullptr;  ///< dc with SGD: its mean square, n floats (starts zeroed)
  float ms_decay = 0.95f;        ///< dc with SGD: decay of mean_square
  long step = 1;                 ///< dc with SGD: this update's number (1-based), for ms's bias
  /// nesterov with AdamW: ψ of NAdam's momentum schedule (torch.optim.NAdam's momentum_decay),
  /// μ_t = β1·(1 − 0.5·0.96^(t·ψ)); 0: μ_t = β1 at every update (nadam_steps)
  float momentum_decay = 0.0f;
  SecantState secant;         ///< secant: its state
  float secant_decay = 0.9f;  ///< secant: decay of num and den
  /// secant: whether a previous gradient is in `secant` (false at a run's first update: the
  /// update then only records its gradient and weights)
  bool secant_pair = false;
};

/// NAdam's two step sizes at update t (1-based): p −= (on_m·m + on_g·g) / (√v̂ + ε), with
/// on_g = lr·(1 − μ_t)/(1 − Π_{i≤t} μ_i) and on_m = lr·μ_{t+1}/(1 − Π_{i≤t+1} μ_i), in double,
/// rounded to float once. μ_t = β1(1 − 0.5·0.96^(t·ψ)) for ψ = momentum_decay > 0 (torch's
/// NAdam); β1 for ψ = 0, where the products are β1^t (std::pow, as before ψ existed).
struct NadamSteps {
  float on_m = 0.0f;
  float on_g = 0.0f;
};
NadamSteps nadam_steps(float lr, float beta1, long t, float momentum_decay);

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
/// With `dc`, the gradient (after grad_scale) is corrected first and m and v take the corrected
/// value; √v̂ of the correction is v's before this update, √(v/(1−β2^(t−1))), and at t = 1 there
/// is no correction. With `secant` likewise, with h·Δ (DelayCorrection). With `nesterov` (NAdam;
/// with a constant β1 unless correction.momentum_decay), or `lookahead` after a compensation:
/// p −= lr·(β1·m/(1−β1^(t+1)) + (1−β1)·g/(1−β1ᵗ)) / (√v / √(1−β2ᵗ) + eps) (nadam_steps).
void adamw_update(Context& ctx, float* params, const float* grads, float* m, float* v, size_t n,
                  const AdamWParams& p, long t, float grad_scale = 1.0f,
                  const DelayCorrection& correction = {}, const UpdateOutputs& out = {});

struct SGDParams {
  float lr = 1e-2f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;  // coupled (added to the gradient), as torch.optim.SGD
};

/// buf = momentum·buf + (g + wd·p); p -= lr·buf (buf starts at 0: first step buf = g).
/// With `nesterov` (torch's nesterov=True), or `lookahead` after a compensation:
/// p −= lr·((g + wd·p) + momentum·buf). With `dc` the gradient is corrected first, with
/// ms/(1−ms_decay^(step−1)) (nothing at step 1), and the mean square then takes the uncorrected
/// gradient: ms = ms_decay·ms + (1−ms_decay)·g²; its eps is 1e-8. With `secant` the gradient is
/// corrected by h·Δ first (DelayCorrection).
void sgd_update(Context& ctx, float* params, const float* grads, float* momentum_buf, size_t n,
                const SGDParams& p, float grad_scale = 1.0f, const DelayCorrection& correction = {},
                const UpdateOutputs& out = {});

/// XPipe's weight prediction (engine/execution/xpipe_prediction.hpp): the scalars of one slot.
struct WeightPrediction {
  float k = 0.0f;         ///< lookahead · the next update's learning rate
  float bc1 = 1.0f;       ///< AdamW: 1 − β1^t
  float bc2_sqrt = 1.0f;  ///< AdamW: sqrt(1 − β2^t)
  float eps = 0.0f;       ///< AdamW: ε
  float wd = 0.0f;        ///< AdamW: the slot's decoupled weight decay
};

/// out = w − k·((m / bc1) / (sqrt(v) / bc2_sqrt + eps) + wd·w) with AdamW's moments m and v;
/// out = w − k·m with SGD's momentum m (v == nullptr). Element-wise over n, in float.
void xpipe_predict(Context& ctx, float* out, const float* w, const float* m, const float* v,
                   size_t n, const WeightPrediction& p);

/// Σ g² in double, in a fixed order independent of the thread count (fixed-size blocks,
/// partial sums combined in block order).
double grad_sumsq(Context& ctx, const float* grads, size_t n);

/// The scale that clips a gradient of global norm sqrt(sumsq) to max_norm (1 when under it
/// or when max_norm <= 0); as torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6).
float clip_scale(double sumsq, double max_norm);

}  // namespace actorpipe
