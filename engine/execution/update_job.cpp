// Update job: one optimizer update of a pipeline stage, handed by its StageWorker to whoever
// applies it (the stage's optimizer shard): the gradients, the version being produced, the rules.
#include "engine/execution/update_job.hpp"

#include <algorithm>

#include "engine/model/layer.hpp"
#include "engine/model/model.hpp"
#include "kernels/check.hpp"
#include "kernels/compute_backend.hpp"

namespace actorpipe {

const Layer& UpdateJob::layer(int i) const {
  AP_CHECK(i >= 0 && i < num_layers(), "layer {} of {}", i, num_layers());
  return *layers_[static_cast<size_t>(i)];
}

std::span<float> UpdateJob::params(int i) {
  AP_CHECK(open_, "stage {}: parameters of an update that is not open", stage_);
  AP_CHECK(i >= 0 && i < num_layers(), "layer {} of {}", i, num_layers());
  return params_[static_cast<size_t>(i)];
}

std::span<const float> UpdateJob::params(int i) const {
  return const_cast<UpdateJob*>(this)->params(i);
}

std::span<float> UpdateJob::grads(int i) {
  AP_CHECK(open_, "stage {}: gradients of an update that is not open", stage_);
  AP_CHECK(i >= 0 && i < num_layers(), "layer {} of {}", i, num_layers());
  const size_t k = static_cast<size_t>(i);
  return {grads_ + offsets_[k], layers_[k]->param_floats()};
}

std::span<float> UpdateJob::gradients() {
  AP_CHECK(open_, "stage {}: gradients of an update that is not open", stage_);
  if (layers_.empty()) return {};
  return {grads_, offsets_.back() + layers_.back()->param_floats()};
}

std::span<const float> UpdateJob::grads(int i) const {
  return const_cast<UpdateJob*>(this)->grads(i);
}

std::span<const float> UpdateJob::weight_change(int i) const {
  AP_CHECK(open_, "stage {}: weight change of an update that is not open", stage_);
  AP_CHECK(i >= 0 && i < num_layers(), "layer {} of {}", i, num_layers());
  if (change_ == nullptr) return {};
  const size_t k = static_cast<size_t>(i);
  return {change_ + offsets_[k], layers_[k]->param_floats()};
}

std::span<const SlotUpdate> UpdateJob::slot_updates(int i) const {
  AP_CHECK(i >= 0 && i < num_layers(), "layer {} of {}", i, num_layers());
  return updates_[static_cast<size_t>(i)];
}

std::span<bf16* const> UpdateJob::rounded(int i) const {
  AP_CHECK(i >= 0 && i < num_layers(), "layer {} of {}", i, num_layers());
  if (rounded_.empty()) return {};
  return rounded_[static_cast<size_t>(i)];
}

TiedRole UpdateJob::tied_role(size_t k) const {
  AP_CHECK(k < tied_.size(), "tied parameter {} of {}", k, tied_.size());
  return tied_[k].role;
}

size_t UpdateJob::tied_offset(size_t k) const {
  const TiedRole role = tied_role(k);
  const TiedLayout& t = tied_[k];
  AP_CHECK(role == TiedRole::owner || role == TiedRole::copy,
           "stage {}: tied parameter {} has no single side here", stage_, k);
  return role == TiedRole::owner ? offsets_[static_cast<size_t>(t.owner_local)] + t.owner_offset
                                 : offsets_[static_cast<size_t>(t.copy_local)] + t.copy_offset;
}

std::span<const float> UpdateJob::tied_grad(size_t k) const {
  AP_CHECK(open_, "stage {}: tied gradient of an update that is not open", stage_);
  return {grads_ + tied_offset(k), tied_[k].numel};
}

void UpdateJob::set_tied_grad(Context& ctx, size_t k, std::span<const float> sum) {
  AP_CHECK(open_ && !finished_, "stage {}: set_tied_grad {} finish_gradients", stage_,
           open_ ? "after" : "outside an update, before");
  const size_t off = tied_offset(k);
  AP_CHECK(sum.size() == tied_[k].numel, "tied gradient of {} floats, expected {}", sum.size(),
           tied_[k].numel);
  ctx.backend().to_backend(grads_ + off, sum.data(), sum.size());
}

std::span<const double> UpdateJob::finish_gradients(Context& ctx) {
  AP_CHECK(open_, "stage {}: finish_gradients() outside an update", stage_);
  AP_CHECK(!finished_, "stage {}: finish_gradients() twice for one update", stage_);
  for (const TiedLayout& t : tied_) {
    if (t.role != TiedRole::both) continue;
    float* owner = grads_ + offsets_[static_cast<size_t>(t.owner_local)] + t.owner_offset;
    float* copy = grads_ + offsets_[static_cast<size_t>(t.copy_local)] + t.copy_offset;
    if (ctx.host_backend()) {
      reduce_tied_grads(ctx, owner, copy, t.numel);
    } else {  // the same sums, owner + copy, on the backend
      ctx.backend().accumulate(owner, copy, static_cast<long>(t.numel));
      ctx.backend().copy(copy, owner, t.numel);
    }
  }
  for (int i = 0; i < num_layers(); ++i) {
    const size_t k = static_cast<size_t>(i);
    sumsq_[k] = model_->grad_sumsq(ctx, first_ + i, grads_ + offsets_[k]);
  }
  finished_ = true;
  return sumsq_;
}

std::span<const float> UpdateJob::tied_weights(size_t k) const {
  const TiedRole role = tied_role(k);
  AP_CHECK(role == TiedRole::owner || role == TiedRole::both,
           "stage {} does not own tied parameter {}", stage_, k);
  AP_CHECK(open_ && applied_, "stage {}: tied weights of an update not applied yet", stage_);
  const TiedLayout& t = tied_[k];
  return params_[static_cast<size_t>(t.owner_local)].subspan(t.owner_offset, t.numel);
}

}  // namespace actorpipe
