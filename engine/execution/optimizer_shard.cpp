// Optimizer shard: the optimizer state of one pipeline stage's parameters, and the update math
// that applies an UpdateJob of that stage with it (AdamW or SGD, per-slot rules, clip scales).
#include "engine/execution/optimizer_shard.hpp"

#include <algorithm>

#include "engine/execution/layer_optimizer.hpp"
#include "kernels/check.hpp"
#include "kernels/optimizer.hpp"

namespace actorpipe {

namespace {

// One update of a layer as optimizer_update does it (one adamw_update / sgd_update call per run
// of slots with the same decay flag; the kernels are element-wise, so the runs do not change the
// bits), except that each slot takes the scale its rule names or is left alone.
void update_layer(Context& ctx, const OptimizerOptions& o, const Layer& layer, float* params,
                  const float* grads, float* state, const float* delta, long step,
                  std::span<const SlotUpdate> rules, const UpdateScales& scales) {
  const bool adamw = o.kind == "adamw";
  const size_t n = layer.param_floats();
  const float lr = scheduled_lr(o, step);
  const DelayCorrection correction = delay_correction(o, n, state, delta, step);
  const auto& slots = layer.slots();
  size_t s = 0;
  while (s < slots.size()) {
    if (rules[s] == SlotUpdate::skip) {
      ++s;
      continue;
    }
    const bool decay = slots[s].decay;
    const SlotUpdate rule = rules[s];
    const size_t begin = slots[s].offset;
    size_t end = begin;
    while (s < slots.size() && slots[s].decay == decay && rules[s] == rule) {
      end = slots[s].offset + slots[s].numel;
      ++s;
    }
    const float wd = decay ? o.weight_decay : 0.0f;
    const float scale = rule == SlotUpdate::tied_scale ? scales.tied : scales.stage;
    if (adamw) {
      const AdamWParams p{lr, o.beta1, o.beta2, o.eps, wd};
      adamw_update(ctx, params + begin, grads + begin, state + begin, state + n + begin,
                   end - begin, p, step, scale, offset_correction(correction, begin));
    } else {
      const SGDParams p{lr, o.momentum, wd};
      sgd_update(ctx, params + begin, grads + begin, state + begin, end - begin, p, scale,
                 offset_correction(correction, begin));
    }
  }
}

}  // namespace

OptimizerShard::OptimizerShard(const Model& model, const Partition& partition, int stage,
                               const OptimizerOptions& optimizer)
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
    total += optimizer_state_floats(optimizer, layers_.back()->param_floats());
  }
  state_.assign(total, 0.0f);
}

std::span<float> OptimizerShard::state(int i) {
  AP_CHECK(i >= 0 && i < num_layers(), "layer {} of {}", i, num_layers());
  const size_t k = static_cast<size_t>(i);
  return {state_.data() + offsets_[k], optimizer_state_floats(opt_, layers_[k]->param_floats())};
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
  for (int i = 0; i < num_layers(); ++i) {
    const size_t k = static_cast<size_t>(i);
    const std::span<const float> change = job.weight_change(i);
    update_layer(ctx, opt_, *layers_[k], job.params(i).data(), job.grads(i).data(),
                 state_.data() + offsets_[k], change.empty() ? nullptr : change.data(), job.step(),
                 job.slot_updates(i), scales);
  }
  for (int i = 0; i < num_layers(); ++i) {
    const std::span<float> g = job.grads(i);
    std::fill(g.begin(), g.end(), 0.0f);
  }
  job.applied_ = true;
}

void OptimizerShard::skip_update(UpdateJob& job) {
  AP_CHECK(job.open() && job.finished() && !job.applied(),
           "stage {}: skip_update of an update that is not open and finished", stage_);
  AP_CHECK(job.stage() == stage_, "stage {}'s optimizer shard given an update of stage {}", stage_,
           job.stage());
  for (int i = 0; i < num_layers(); ++i) {
    const std::span<float> g = job.grads(i);
    std::fill(g.begin(), g.end(), 0.0f);
  }
  job.applied_ = true;
}

}  // namespace actorpipe
