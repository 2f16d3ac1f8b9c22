// BackendTrainer: the reference step with every buffer in a ComputeBackend's memory.
#include "engine/execution/backend_trainer.hpp"

#include <cmath>

#include "engine/execution/layer_optimizer.hpp"
#include "kernels/check.hpp"
#include "kernels/optimizer.hpp"

namespace actorpipe {

BackendTrainer::BackendTrainer(Model model, const OptimizerOptions& opt, int B, int T,
                               ComputeBackend& backend)
    : model_(std::move(model)), opt_(opt), B_(B), T_(T), backend_(backend), ctx_(1) {
  AP_CHECK(B > 0 && T > 0 && T <= model_.options().context, "B = {}, T = {} (context {})", B, T,
           model_.options().context);
  ctx_.set_backend(&backend_);
  const size_t hidden = static_cast<size_t>(B) * T * model_.options().width;
  const int L = model_.num_layers();
  buffers_.resize(static_cast<size_t>(L));
  std::vector<float> init;
  for (int i = 0; i < L; ++i) {
    const Layer& layer = model_.layer(i);
    LayerBuffers& b = buffers_[static_cast<size_t>(i)];
    const size_t n = layer.param_floats();
    b.params = BackendBuffer(backend_, n);
    b.grads = BackendBuffer(backend_, n);
    b.state = BackendBuffer(backend_, optimizer_state_floats(opt_, layer));
    b.saved = BackendBuffer(backend_, layer.saved_floats(B, T));
    init.assign(n, 0.0f);
    model_.init_layer(i, init.data());
    backend_.to_backend(b.params.data(), init.data(), n);
    if (i < L - 1) hidden_.emplace_back(backend_, hidden);
  }
  dhidden_a_ = BackendBuffer(backend_, hidden);
  dhidden_b_ = BackendBuffer(backend_, hidden);
  backend_.synchronize();  // `init` goes now
}

void BackendTrainer::set_precision(Precision p) {
  ctx_.set_bf16_activations(false);  // saved_ holds f32 activations (saved_floats)
  ctx_.set_precision(p);
}

void BackendTrainer::reset_scratch() {
  ctx_.arena().reset();
  backend_.reset_scratch();
}

LossStats BackendTrainer::forward(const Microbatch& mb) {
  AP_CHECK(mb.B == B_ && mb.T == T_, "microbatch ({}, {}) but the trainer was built for ({}, {})",
           mb.B, mb.T, B_, T_);
  LossStats loss;
  for (int i = 0; i < model_.num_layers(); ++i) {
    const size_t k = static_cast<size_t>(i);
    reset_scratch();
    const float* in = i > 0 ? hidden_[k - 1].data() : nullptr;
    float* out = i + 1 < model_.num_layers() ? hidden_[k].data() : nullptr;
    loss = model_.layer(i).forward(ctx_, buffers_[k].params.data(), mb, in, out,
                                   buffers_[k].saved.data());
  }
  return loss;
}

void BackendTrainer::run_backward(const Microbatch& mb, float dloss) {
  float* dout = nullptr;  // gradient w.r.t. the current layer's output
  for (int i = model_.num_layers() - 1; i >= 0; --i) {
    const size_t k = static_cast<size_t>(i);
    reset_scratch();
    float* din = dout == dhidden_a_.data() ? dhidden_b_.data() : dhidden_a_.data();
    const float* in = i > 0 ? hidden_[k - 1].data() : nullptr;
    model_.layer(i).backward(ctx_, buffers_[k].params.data(), buffers_[k].grads.data(), mb, in,
                             buffers_[k].saved.data(), dout, i > 0 ? din : nullptr, dloss, nullptr);
    dout = din;
  }
}

double BackendTrainer::compute_gradients(std::span<const Microbatch> mbs) {
  AP_CHECK(!mbs.empty(), "a step needs at least one microbatch");
  const int m = static_cast<int>(mbs.size());
  for (LayerBuffers& b : buffers_)
    backend_.fill_zero(b.grads.data(), static_cast<long>(b.grads.size()));
  double loss = 0.0;
  for (const Microbatch& mb : mbs) {
    const LossStats stats = forward(mb);
    loss += stats.mean();
    run_backward(mb, loss_scale(stats.count, m));
  }
  // reduce_tied_grads on the backend: owner += copy (owner[k] + copy[k]), then copy = owner
  for (const TiedParam& t : model_.tied()) {
    const auto [a, b] = model_.tied_slots(t);
    float* owner = buffers_[static_cast<size_t>(t.owner_layer)].grads.data() + a.offset;
    float* copy = buffers_[static_cast<size_t>(t.copy_layer)].grads.data() + b.offset;
    backend_.accumulate(owner, copy, static_cast<long>(a.numel));
    backend_.copy(copy, owner, a.numel);
  }
  return loss / m;
}

void BackendTrainer::apply_update() {
  double sumsq = 0.0;
  for (int i = 0; i < model_.num_layers(); ++i)
    sumsq += model_.grad_sumsq(ctx_, i, buffers_[static_cast<size_t>(i)].grads.data());
  last_grad_norm_ = std::sqrt(sumsq);
  const float scale = clip_scale(sumsq, opt_.grad_clip);
  ++steps_;
  for (int i = 0; i < model_.num_layers(); ++i) {
    LayerBuffers& b = buffers_[static_cast<size_t>(i)];
    optimizer_update(ctx_, opt_, model_.layer(i), b.params.data(), b.grads.data(), b.state.data(),
                     steps_, scale);
  }
}

double BackendTrainer::step(std::span<const Microbatch> mbs) {
  const double loss = compute_gradients(mbs);
  apply_update();
  return loss;
}

std::vector<float> BackendTrainer::params(int layer) const {
  const BackendBuffer& b = buffers_.at(static_cast<size_t>(layer)).params;
  std::vector<float> out(b.size());
  backend_.to_host(out.data(), b.data(), b.size());
  return out;
}

std::vector<float> BackendTrainer::grads(int layer) const {
  const BackendBuffer& b = buffers_.at(static_cast<size_t>(layer)).grads;
  std::vector<float> out(b.size());
  backend_.to_host(out.data(), b.data(), b.size());
  return out;
}

void BackendTrainer::set_params(int layer, std::span<const float> values) {
  BackendBuffer& b = buffers_.at(static_cast<size_t>(layer)).params;
  AP_CHECK(values.size() == b.size(), "layer {}: {} parameter values for {} parameters", layer,
           values.size(), b.size());
  backend_.to_backend(b.data(), values.data(), b.size());
  backend_.synchronize();
}

}  // namespace actorpipe
