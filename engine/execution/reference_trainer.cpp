// ReferenceTrainer: the single-process, single-Context numerical oracle of one optimizer step
// (gradient accumulation over m microbatches, tied-gradient sum, global-norm clip, update).
#include "engine/execution/reference_trainer.hpp"

#include <algorithm>
#include <cmath>

#include "engine/execution/layer_optimizer.hpp"
#include "kernels/check.hpp"
#include "kernels/optimizer.hpp"

namespace actorpipe {

ReferenceTrainer::ReferenceTrainer(Model model, const OptimizerOptions& opt, int B, int T,
                                   int threads)
    : model_(std::move(model)), opt_(opt), B_(B), T_(T), ctx_(threads) {
  AP_CHECK(B > 0 && T > 0 && T <= model_.options().context, "B = {}, T = {} (context {})", B, T,
           model_.options().context);
  const size_t hidden = static_cast<size_t>(B) * T * model_.options().width;
  const int L = model_.num_layers();
  buffers_.resize(static_cast<size_t>(L));
  hidden_.resize(static_cast<size_t>(L - 1));
  for (int i = 0; i < L; ++i) {
    const Layer& layer = model_.layer(i);
    LayerBuffers& b = buffers_[static_cast<size_t>(i)];
    const size_t n = layer.param_floats();
    const size_t ns = optimizer_state_floats(opt_, layer);
    // params, grads and state each from a cache line of the storage
    constexpr size_t kLine = kCacheLine / sizeof(float);
    const size_t np = (n + kLine - 1) / kLine * kLine;
    b.storage.assign(2 * np + ns, 0.0f);
    b.params = {b.storage.data(), n};
    b.grads = {b.storage.data() + np, n};
    b.state = {b.storage.data() + 2 * np, ns};
    b.saved.assign(layer.saved_floats(B, T), 0.0f);
    model_.init_layer(i, b.params.data());
    if (i < L - 1) hidden_[static_cast<size_t>(i)].assign(hidden, 0.0f);
  }
  dhidden_a_.assign(hidden, 0.0f);
  dhidden_b_.assign(hidden, 0.0f);
}

void ReferenceTrainer::set_precision(Precision p) {
  ctx_.set_precision(p);
  // the saved activations' layout follows the Context (bf16 blocks keep some in bf16)
  for (int i = 0; i < model_.num_layers(); ++i) {
    AlignedVector<float>& saved = buffers_[static_cast<size_t>(i)].saved;
    saved.assign(model_.layer(i).saved_floats_for(B_, T_, ctx_.bf16_activations()), 0.0f);
    saved.shrink_to_fit();
  }
  if (p == Precision::bf16 && ctx_.bf16_weights() == nullptr) {
    for (const LayerBuffers& b : buffers_) bf16_weights_.cover(b.params.data(), b.params.size());
    ctx_.set_bf16_weights(&bf16_weights_);
  }
}

LossStats ReferenceTrainer::forward(const Microbatch& mb) {
  AP_CHECK(mb.B == B_ && mb.T == T_, "microbatch ({}, {}) but the trainer was built for ({}, {})",
           mb.B, mb.T, B_, T_);
  bf16_weights_.sync(weights_generation_);
  LossStats loss;
  for (int i = 0; i < model_.num_layers(); ++i) {
    const size_t k = static_cast<size_t>(i);
    ctx_.arena().reset();
    const float* in = i > 0 ? hidden_[k - 1].data() : nullptr;
    float* out = i + 1 < model_.num_layers() ? hidden_[k].data() : nullptr;
    loss = model_.layer(i).forward(ctx_, buffers_[k].params.data(), mb, in, out,
                                   buffers_[k].saved.data());
  }
  return loss;
}

void ReferenceTrainer::run_backward(const Microbatch& mb, float dloss) {
  bf16_weights_.sync(weights_generation_);
  float* dout = nullptr;  // gradient w.r.t. the current layer's output
  for (int i = model_.num_layers() - 1; i >= 0; --i) {
    const size_t k = static_cast<size_t>(i);
    ctx_.arena().reset();
    float* din = dout == dhidden_a_.data() ? dhidden_b_.data() : dhidden_a_.data();
    const float* in = i > 0 ? hidden_[k - 1].data() : nullptr;
    model_.layer(i).backward(ctx_, buffers_[k].params.data(), buffers_[k].grads.data(), mb, in,
                             buffers_[k].saved.data(), dout, i > 0 ? din : nullptr, dloss, nullptr);
    dout = din;
  }
}

const float* ReferenceTrainer::logits() const {
  const int last = model_.num_layers() - 1;
  return model_.layer(last).logits(buffers_[static_cast<size_t>(last)].saved.data(), B_, T_);
}

double ReferenceTrainer::compute_gradients(std::span<const Microbatch> mbs) {
  AP_CHECK(!mbs.empty(), "a step needs at least one microbatch");
  const int m = static_cast<int>(mbs.size());
  if (!grads_zero_)
    for (LayerBuffers& b : buffers_) std::fill(b.grads.begin(), b.grads.end(), 0.0f);
  grads_zero_ = false;
  double loss = 0.0;
  for (const Microbatch& mb : mbs) {
    const LossStats stats = forward(mb);
    loss += stats.mean();
    run_backward(mb, loss_scale(stats.count, m));
  }
  for (const TiedParam& t : model_.tied()) {
    const auto [a, b] = model_.tied_slots(t);
    reduce_tied_grads(ctx_, grads(t.owner_layer).data() + a.offset,
                      grads(t.copy_layer).data() + b.offset, a.numel);
  }
  return loss / m;
}

void ReferenceTrainer::apply_update() {
  double sumsq = 0.0;
  for (int i = 0; i < model_.num_layers(); ++i)
    sumsq += model_.grad_sumsq(ctx_, i, grads(i).data());
  last_grad_norm_ = std::sqrt(sumsq);
  const float scale = clip_scale(sumsq, opt_.grad_clip);
  ++steps_;
  if (!fused_update_) {
    for (int i = 0; i < model_.num_layers(); ++i)
      optimizer_update(ctx_, opt_, model_.layer(i), params(i).data(), grads(i).data(),
                       optimizer_state(i).data(), steps_, scale);
    ++weights_generation_;
    return;
  }
  // one pass per layer: the update, the gradient cleared, the products' bf16 copies written
  const bool round = ctx_.precision() == Precision::bf16 && ctx_.bf16_weights() == &bf16_weights_;
  rounded_src_.clear();
  for (int i = 0; i < model_.num_layers(); ++i) {
    LayerBuffers& b = buffers_[static_cast<size_t>(i)];
    const auto& slots = model_.layer(i).slots();
    rules_.assign(slots.size(), SlotRule{true, scale, nullptr});
    for (size_t s = 0; round && s < slots.size(); ++s) {
      if (!slots[s].product_operand) continue;
      const float* w = b.params.data() + slots[s].offset;
      rules_[s].rounded = bf16_weights_.reserve(w, static_cast<int64_t>(slots[s].numel));
      rounded_src_.push_back(w);
    }
    optimizer_update_slots(ctx_, opt_, model_.layer(i), b.params.data(), b.grads.data(),
                           b.state.data(), steps_, rules_, b.grads.data());
  }
  grads_zero_ = true;
  ++weights_generation_;
  bf16_weights_.sync(weights_generation_);
  for (const float* w : rounded_src_) bf16_weights_.mark_current(w);
}

double ReferenceTrainer::step(std::span<const Microbatch> mbs) {
  const double loss = compute_gradients(mbs);
  apply_update();
  return loss;
}

}  // namespace actorpipe
