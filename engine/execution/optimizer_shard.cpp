// Optimizer shard: the optimizer state of one pipeline stage's parameters, and the update math
// that applies an UpdateJob of that stage with it (AdamW or SGD, per-slot rules, clip scales).
#include "engine/execution/optimizer_shard.hpp"

#include <algorithm>

#include "engine/execution/layer_optimizer.hpp"
#include "kernels/check.hpp"
#include "kernels/compute_backend.hpp"
#include "kernels/optimizer.hpp"

namespace actorpipe {

OptimizerShard::OptimizerShard(const Model& model, const Partition& partition, int stage,
                               const OptimizerOptions& optimizer, BackendMemory& memory)
    : opt_(optimizer), stage_(stage) {
  AP_CHECK(partition.num_layers() == model.num_layers(),
           "partition of {} layers for a model of {} layers", partition.num_layers(),
           model.num_layers());
  AP_CHECK(stage >= 0 && stage < partition.stages(), "stage {} of {}", stage, partition.stages());
  AP_CHECK(optimizer.kind == "adamw" || optimizer.kind == "sgd", "optimizer.kind = \"{}\"",
           optimizer.kind);
  first_ = partition.begin(stage);
  size_t total = 0;
  for (int i = 0; i < partition.size(stage); ++i) {
    layers_.push_back(model.layer_ptr(first_ + i));
    offsets_.push_back(total);
    total += optimizer_state_floats(optimizer, *layers_.back());
  }
  state_ = BackendBuffer(memory, total);
}

std::span<float> OptimizerShard::state(int i) {
  AP_CHECK(i >= 0 && i < num_layers(), "layer {} of {}", i, num_layers());
  const size_t k = static_cast<size_t>(i);
  return {state_.data() + offsets_[k], optimizer_state_floats(opt_, *layers_[k])};
}

std::span<const float> OptimizerShard::state(int i) const {
  return const_cast<OptimizerShard*>(this)->state(i);
}

void OptimizerShard::run_update(Context& ctx, UpdateJob& job, const UpdateScales& scales) {
  AP_CHECK(job.open(), "stage {}: run_update of an update that is not open", stage_);
  AP_CHECK(job.stage() == stage_ && job.num_layers() == num_layers() && job.first_layer() == first_,
           "stage {}'s optimizer shard given an update of stage {}", stage_, job.stage());
  AP_CHECK(job.finished(), "stage {}: finish_gradients() must come before the update", stage_);
  AP_CHECK(!job.applied(), "stage {}: update to version {} applied twice", stage_, job.step());
  std::vector<SlotRule>& rules = rules_;
  for (int i = 0; i < num_layers(); ++i) {
    const size_t k = static_cast<size_t>(i);
    const std::span<const SlotUpdate> updates = job.slot_updates(i);
    const std::span<bf16* const> rounded = job.rounded(i);
    rules.assign(updates.size(), SlotRule{});
    for (size_t s = 0; s < updates.size(); ++s) {
      rules[s].update = updates[s] != SlotUpdate::skip;
      rules[s].scale = updates[s] == SlotUpdate::tied_scale ? scales.tied : scales.stage;
      rules[s].rounded = rounded.empty() || !rules[s].update ? nullptr : rounded[s];
    }
    // the gradients are cleared in the update's pass: the worker accumulates a later update
    // into this buffer
    const std::span<const float> change = job.weight_change(i);
    const std::span<float> grads = job.grads(i);
    optimizer_update_slots(ctx, opt_, *layers_[k], job.params(i).data(), grads.data(),
                           state_.data() + offsets_[k], job.step(), rules, grads.data(),
                           change.empty() ? nullptr : change.data());
  }
  // off the host the new version is complete before the commit hands it to the stage (which may
  // compute on another stream: a companion's)
  if (!ctx.host_backend()) ctx.backend().synchronize();
  job.rounded_written_ = true;
  job.applied_ = true;
}

void OptimizerShard::skip_update(Context& ctx, UpdateJob& job) {
  AP_CHECK(job.open() && job.finished() && !job.applied(),
           "stage {}: skip_update of an update that is not open and finished", stage_);
  AP_CHECK(job.stage() == stage_, "stage {}'s optimizer shard given an update of stage {}", stage_,
           job.stage());
  for (int i = 0; i < num_layers(); ++i) {
    const std::span<float> g = job.grads(i);
    if (!g.empty()) ctx.backend().fill_zero(g.data(), static_cast<long>(g.size()));
  }
  if (!ctx.host_backend()) ctx.backend().synchronize();
  job.rounded_written_ = false;
  job.applied_ = true;
}

}  // namespace actorpipe
