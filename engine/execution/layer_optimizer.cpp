// Layer optimizer: applies AdamW or SGD (OptimizerOptions) to one layer's parameter buffer,
// with per-slot weight decay, linear lr warm-up and cosine lr decay. Shared by every executor of a
// step.
#include "engine/execution/layer_optimizer.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "engine/delay_correction.hpp"
#include "kernels/bf16.hpp"
#include "kernels/check.hpp"
#include "kernels/compute_backend.hpp"

namespace actorpipe {
namespace {

bool is_adamw(const OptimizerOptions& o) {
  AP_CHECK(o.kind == "adamw" || o.kind == "sgd", "optimizer.kind = \"{}\": expected adamw | sgd",
           o.kind);
  return o.kind == "adamw";
}

DelayCorrectionChoice choice_of(const OptimizerOptions& o) {
  DelayCorrectionChoice c;
  AP_CHECK(from_string(o.delay_correction, c),
           "optimizer.delay_correction = \"{}\": expected one of {}", o.delay_correction,
           fmt::join(delay_correction_names, ", "));
  return c;
}

using Compensation = DelayCorrectionChoice::Compensation;

// Floats of n parameters' state that the optimizer itself keeps (AdamW m and v, SGD momentum)
size_t base_state_floats(const OptimizerOptions& o, size_t n) {
  return is_adamw(o) ? 2 * n : n;
}

}  // namespace

size_t optimizer_state_floats(const OptimizerOptions& o, size_t n) {
  const size_t base = base_state_floats(o, n);
  switch (choice_of(o).compensation) {
    case Compensation::dc:
      return is_adamw(o) ? base : base + n;  // SGD: its mean square
    case Compensation::secant:
      return base + 4 * n;  // previous weights and gradient, the two running means
    case Compensation::none:
      break;
  }
  return base;
}

bool needs_weight_change(const OptimizerOptions& o) {
  return choice_of(o).needs_weight_change();
}

RotationShape slot_rotation(const OptimizerOptions& o, const ParamSlot& slot) {
  if (!o.basis_rotation || !is_adamw(o) || slot.shape.size() != 2) return {};
  return rotation_shape(slot.shape[0], slot.shape[1], o.rotation_max_dim, o.rotation_block);
}

size_t rotation_state_offset(const OptimizerOptions& o, const Layer& layer, size_t s) {
  const auto& slots = layer.slots();
  AP_CHECK(s < slots.size(), "rotation_state_offset: slot {} of {}", s, slots.size());
  size_t at = optimizer_state_floats(o, layer.param_floats());
  for (size_t k = 0; k < s; ++k) at += slot_rotation(o, slots[k]).state_floats();
  return at;
}

size_t optimizer_state_floats(const OptimizerOptions& o, const Layer& layer) {
  size_t floats = optimizer_state_floats(o, layer.param_floats());
  for (const ParamSlot& slot : layer.slots()) floats += slot_rotation(o, slot).state_floats();
  return floats;
}

DelayCorrection delay_correction(const OptimizerOptions& o, size_t n, float* state,
                                 const float* delta, long step) {
  const DelayCorrectionChoice choice = choice_of(o);
  DelayCorrection c;
  c.momentum_decay = o.momentum_decay;
  switch (choice.compensation) {
    case Compensation::none:
      if (choice.lookahead) c.kind = DelayCorrectionKind::nesterov;
      return c;
    case Compensation::dc:
      c.kind = DelayCorrectionKind::dc;
      c.lookahead = choice.lookahead;
      c.lambda = o.dc_lambda;
      c.delta = delta;
      c.step = step;
      if (!is_adamw(o)) {  // SGD keeps its own mean square after the momentum
        c.mean_square = state + n;
        c.ms_decay = o.beta2;
      }
      return c;
    case Compensation::secant: {
      c.kind = DelayCorrectionKind::secant;
      c.lookahead = choice.lookahead;
      c.delta = delta;
      c.step = step;
      float* s = state + base_state_floats(o, n);
      c.secant = SecantState{s, s + n, s + 2 * n, s + 3 * n};
      c.secant_decay = o.secant_decay;
      c.secant_pair = step > 1;
      return c;
    }
  }
  return c;
}

DelayCorrection offset_correction(const DelayCorrection& c, size_t begin) {
  DelayCorrection out = c;
  if (out.delta != nullptr) out.delta += begin;
  if (out.mean_square != nullptr) out.mean_square += begin;
  if (out.secant.weights != nullptr) {
    out.secant.weights += begin;
    out.secant.grad += begin;
    out.secant.num += begin;
    out.secant.den += begin;
  }
  return out;
}

float scheduled_lr(const OptimizerOptions& o, long step) {
  AP_CHECK(step >= 1, "optimizer step {} (steps count from 1)", step);
  if (o.warmup_steps > 0 && step < o.warmup_steps)
    return o.lr * static_cast<float>(step) / static_cast<float>(o.warmup_steps);
  const long w = o.warmup_steps;
  if (o.decay_steps <= 0 || step <= w) return o.lr;
  const double p =
      std::min(1.0, static_cast<double>(step - w) / static_cast<double>(o.decay_steps - w));
  const double lr = static_cast<double>(o.lr), lo = static_cast<double>(o.min_lr);
  return static_cast<float>(lo + (lr - lo) * 0.5 * (1.0 + std::cos(std::numbers::pi * p)));
}

namespace {

// optimizer_update_slots with slot s's rule rule_of(s)
template <class RuleOf>
void update_runs(Context& ctx, const OptimizerOptions& o, const Layer& layer, float* params,
                 const float* grads, float* state, long step, const RuleOf& rule_of, float* clear,
                 const float* delta) {
  const bool adamw = is_adamw(o);
  const size_t n = layer.param_floats();
  const float lr = scheduled_lr(o, step);
  const DelayCorrection correction = delay_correction(o, n, state, delta, step);
  const auto& slots = layer.slots();
  AP_CHECK(clear == nullptr || clear == grads,
           "optimizer_update_slots: the gradient to clear is not the one it reads");
  size_t rotation_at = optimizer_state_floats(o, n);  // the next rotated slot's state
  const bool rotation_lookahead = o.basis_rotation && choice_of(o).lookahead;
  size_t s = 0;
  while (s < slots.size()) {
    const SlotRule rule = rule_of(s);
    if (const RotationShape shape = slot_rotation(o, slots[s]); shape.any()) {
      const ParamSlot& slot = slots[s++];
      float* rotation = state + rotation_at;
      rotation_at += shape.state_floats();
      if (rule.update) {
        AP_CHECK(ctx.host_backend(),
                 "optimizer.basis_rotation: computed on the host only, not on {}",
                 ctx.backend().name());
        const size_t b = slot.offset;
        const float wd = slot.decay ? o.weight_decay : 0.0f;
        const RotationStep rs{(step - 1) % o.rotation_every == 0, rotation_lookahead,
                              o.momentum_decay};
        rotated_adamw_update(ctx, params + b, grads + b, state + b, state + n + b, shape,
                             rotation_state(shape, rotation),
                             AdamWParams{lr, o.beta1, o.beta2, o.eps, wd}, step, rule.scale, rs);
        if (rule.rounded != nullptr)
          convert_to_bf16(ctx, params + b, rule.rounded, static_cast<int64_t>(slot.numel));
      }
      if (clear != nullptr)
        ctx.backend().fill_zero(clear + slot.offset, static_cast<long>(slot.numel));
      continue;
    }
    const bool decay = slots[s].decay;
    const size_t begin = slots[s].offset;
    size_t end = slots[s].offset + slots[s].numel;
    // a maximal run of slots with the same decay flag and rule; one with a bf16 output alone
    for (++s; s < slots.size() && rule.rounded == nullptr; ++s) {
      const SlotRule next = rule_of(s);
      if (slots[s].decay != decay || next.update != rule.update || next.scale != rule.scale ||
          next.rounded != nullptr || slot_rotation(o, slots[s]).any())
        break;
      end = slots[s].offset + slots[s].numel;
    }
    if (!rule.update) {
      if (clear != nullptr) ctx.backend().fill_zero(clear + begin, static_cast<long>(end - begin));
      continue;
    }
    const float wd = decay ? o.weight_decay : 0.0f;
    // off the host a gradient is cleared after the update (the same bits: the update reads it
    // first either way)
    const bool clear_after = clear != nullptr && !ctx.host_backend() && rule.rounded == nullptr;
    const UpdateOutputs out{clear != nullptr && !clear_after ? clear + begin : nullptr,
                            rule.rounded};
    if (out.clear == nullptr && out.rounded == nullptr) {
      // the update alone: the Context's backend's (on the host the CPU kernel; element-wise, so
      // its threads do not change the bits)
      if (adamw)
        ctx.backend().adamw_update(params + begin, grads + begin, state + begin, state + n + begin,
                                   end - begin, AdamWParams{lr, o.beta1, o.beta2, o.eps, wd}, step,
                                   rule.scale, offset_correction(correction, begin));
      else
        ctx.backend().sgd_update(params + begin, grads + begin, state + begin, end - begin,
                                 SGDParams{lr, o.momentum, wd}, rule.scale,
                                 offset_correction(correction, begin));
      if (clear_after) ctx.backend().fill_zero(clear + begin, static_cast<long>(end - begin));
      continue;
    }
    // a gradient cleared or a bf16 copy written in the same pass: the CPU kernel's outputs
    AP_CHECK(ctx.host_backend(), "the optimizer update on {} clears and rounds nothing in its pass",
             ctx.backend().name());
    if (adamw) {
      const AdamWParams p{lr, o.beta1, o.beta2, o.eps, wd};
      adamw_update(ctx, params + begin, grads + begin, state + begin, state + n + begin,
                   end - begin, p, step, rule.scale, offset_correction(correction, begin), out);
    } else {
      const SGDParams p{lr, o.momentum, wd};
      sgd_update(ctx, params + begin, grads + begin, state + begin, end - begin, p, rule.scale,
                 offset_correction(correction, begin), out);
    }
  }
}

}  // namespace

void optimizer_update(Context& ctx, const OptimizerOptions& o, const Layer& layer, float* params,
                      const float* grads, float* state, long step, float grad_scale,
                      const float* delta) {
  update_runs(
      ctx, o, layer, params, grads, state, step,
      [&](size_t) {
        return SlotRule{true, grad_scale, nullptr};
      },
      nullptr, delta);
}

void optimizer_update_slots(Context& ctx, const OptimizerOptions& o, const Layer& layer,
                            float* params, const float* grads, float* state, long step,
                            std::span<const SlotRule> rules, float* clear, const float* delta) {
  AP_CHECK(rules.size() == layer.slots().size(),
           "optimizer_update_slots: {} slot rules for {} slots", rules.size(),
           layer.slots().size());
  update_runs(
      ctx, o, layer, params, grads, state, step, [&](size_t s) { return rules[s]; }, clear, delta);
}

}  // namespace actorpipe
