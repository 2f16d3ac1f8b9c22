// Layer optimizer: applies AdamW or SGD (OptimizerOptions) to one layer's parameter buffer,
// with per-slot weight decay and linear lr warm-up. Shared by every executor of a step.
#pragma once

#include <cstddef>
#include <span>

#include "engine/model/layer.hpp"
#include "engine/options.hpp"
#include "kernels/basis_rotation.hpp"
#include "kernels/context.hpp"
#include "kernels/optimizer.hpp"

namespace actorpipe {

/// Floats of optimizer state for a buffer of n parameters: adamw 2n (m then v), sgd n
/// (momentum), sgd with a dc delay correction 2n (momentum, then dc's mean square); a secant
/// delay correction adds 4n after those (the previous gradient's weights, the previous gradient,
/// the running means of dg·dx and dx²: SecantState). The state starts zeroed. This is the
/// element-wise part of a layer's state; optimizer.basis_rotation adds its matrices after it.
size_t optimizer_state_floats(const OptimizerOptions& o, size_t n);

/// Floats of a layer's optimizer state: optimizer_state_floats(o, param_floats()), then, with
/// optimizer.basis_rotation, each rotated slot's RotationState in slot order
/// (slot_rotation(o, slot).state_floats()).
size_t optimizer_state_floats(const OptimizerOptions& o, const Layer& layer);

/// How optimizer.basis_rotation rotates a slot: a matrix (two dimensions) of an AdamW layer, each
/// side whose dimension is at most optimizer.rotation_max_dim; nothing (any() false) for every
/// other slot, and without basis_rotation.
RotationShape slot_rotation(const OptimizerOptions& o, const ParamSlot& slot);

/// Where slot s's RotationState starts in a layer's optimizer state (floats from its start;
/// meaningful for a slot that rotates).
size_t rotation_state_offset(const OptimizerOptions& o, const Layer& layer, size_t s);

/// The kernels' DelayCorrection for o.delay_correction (engine/delay_correction.hpp) at update
/// `step` of a buffer of n parameters with optimizer state `state`, Δ = `delta` (W_now − W_stale, n
/// floats; nullptr = nothing stale). Offsets into the buffer are the caller's (see
/// offset_correction).
DelayCorrection delay_correction(const OptimizerOptions& o, size_t n, float* state,
                                 const float* delta, long step);
/// The same correction for the elements [begin, ...) of the buffer.
DelayCorrection offset_correction(const DelayCorrection& c, size_t begin);

/// True when o.delay_correction needs Δ = W_now − W_stale for each update (dc, secant).
bool needs_weight_change(const OptimizerOptions& o);

/// Learning rate of optimizer step `step` (1-based), W = warmup_steps, D = decay_steps:
///   step < W:                  lr·step/W                        (linear warm-up)
///   step = W, or D = 0:        lr
///   else:                      min_lr + (lr − min_lr)·(1 + cos(π·p))/2,
///                              p = min(1, (step − W) / (D − W))  (cosine decay to min_lr at D)
/// The cosine is taken in double and the result rounded to float once; every executor calls
/// this one function, so all of them use the same bits.
float scheduled_lr(const OptimizerOptions& o, long step);

/// One update of a layer: params -= f(grad_scale·grads, state) at step `step` (1-based: AdamW
/// bias correction uses it). Weight decay (o.weight_decay) applies only to slots with
/// ParamSlot::decay (matrices, embeddings), never to biases and layernorm parameters: decoupled
/// for AdamW, added to the gradient for SGD. o.delay_correction applies (dc with `delta`, the
/// layer's Δ = W_now − W_stale, nullptr when nothing is stale). Element-wise, so equal inputs
/// give equal bits. The Context's backend computes it (every buffer in that backend's memory; on
/// the host the CPU kernels). With optimizer.basis_rotation a slot that rotates (slot_rotation)
/// takes rotated_adamw_update instead, on the host (its products are gemm's, so the bits do not
/// depend on the thread count either), refreshing its eigenvectors at the updates
/// 1, 1 + rotation_every, 1 + 2·rotation_every, ...
void optimizer_update(Context& ctx, const OptimizerOptions& o, const Layer& layer, float* params,
                      const float* grads, float* state, long step, float grad_scale,
                      const float* delta = nullptr);

/// How one slot of a layer (Layer::slots() order) is updated by optimizer_update_slots:
///  update   false: left as it is (its gradient is still cleared when the update clears)
///  scale    multiplies its gradient (a clip scale)
///  rounded  where the new weights' bf16 rounding goes, written in the update's pass
///           (UpdateOutputs::rounded); nullptr = nowhere
struct SlotRule {
  bool update = true;
  float scale = 1.0f;
  bf16* rounded = nullptr;
};

/// optimizer_update with a rule per slot; `clear` (nullptr, or the same floats as `grads`) is
/// zeroed in the update's own pass (UpdateOutputs::clear), skipped slots included. One adamw_update
/// / sgd_update call per maximal run of slots with the same decay flag and rule (a slot with a bf16
/// output is a run of its own); the kernels are element-wise, so the runs do not change the bits:
/// with every rule {true, grad_scale, nullptr} and no clearing, the bits of optimizer_update.
void optimizer_update_slots(Context& ctx, const OptimizerOptions& o, const Layer& layer,
                            float* params, const float* grads, float* state, long step,
                            std::span<const SlotRule> rules, float* clear,
                            const float* delta = nullptr);

}  // namespace actorpipe
