// StageWorker: the compute unit of one pipeline stage (its layers' weight versions, gradients,
// activation stash and Context) with one exec_* call per action kind and the update hand-off.
#include "engine/execution/stage_worker.hpp"

#include <algorithm>
#include <atomic>

#include "engine/execution/optimizer_shard.hpp"
#include "engine/execution/xpipe_prediction.hpp"
#include "engine/schedule/generators.hpp"
#include "engine/schedule/simulator.hpp"
#include "kernels/check.hpp"

namespace actorpipe {

namespace {

int default_stash_slots(Mode mode, int d, int r, int m) {
  // sync schedules cover one step; an async one reaches its steady state after d microbatches
  const int steps = is_synchronous(mode) ? 1 : d + 1;
  auto s = make_schedule(mode, d, m, steps);
  AP_CHECK(s.ok(), "{}", s.ok() ? "" : s.error().message);
  return peak_stash(*s)[static_cast<size_t>(r)];
}

}  // namespace

TiedSync tied_sync(Mode mode) {
  return is_synchronous(mode) ? TiedSync::exchange_grads : TiedSync::follow_owner;
}

std::string to_string(TiedVersion v) {
  if (!v.valid()) return "none";
  return v.lookahead == 0 ? std::to_string(v.version)
                          : std::to_string(v.version) + "+" + std::to_string(v.lookahead);
}

bool clips_globally(Mode mode) {
  return is_synchronous(mode);
}

// ---------------------------------------------------------------------------------------------

struct StageWorker::Slot {
  int microbatch = -1;        // schedule index; -1 = free
  int version = 0;            // absolute version of its F
  Tensor input;               // the previous stage's output, held until the B
  std::vector<float> hidden;  // outputs of the stage's layers but the last, (B,T,C) each
  std::vector<float> saved;   // every layer's saved activations
  LossStats loss;
};

/// Output tensors handed to other stages without copying: a tensor is reused once every other
/// holder has dropped it (its storage's use count is back to 1).
class StageWorker::TensorPool {
 public:
  TensorPool(std::vector<int64_t> shape, int preallocate) : shape_(std::move(shape)) {
    for (int i = 0; i < preallocate; ++i) items_.push_back(Tensor::zeros(shape_));
  }
  Tensor acquire() {
    for (const Tensor& t : items_) {
      if (t.storage().use_count() == 1) {
        // the last other holder's reads happen before our writes
        std::atomic_thread_fence(std::memory_order_acquire);
        return t;
      }
    }
    items_.push_back(Tensor::zeros(shape_));
    return items_.back();
  }

 private:
  std::vector<int64_t> shape_;
  std::vector<Tensor> items_;
};

StageWorker::StageWorker(const Model& model, const Partition& partition,
                         const OptimizerOptions& optimizer, const StageWorkerOptions& options)
    : model_(model),
      partition_(partition),
      opt_(optimizer),
      opts_(options),
      stage_(options.stage),
      tied_sync_(tied_sync(options.mode)),
      ctx_(options.threads) {
  AP_CHECK(partition.num_layers() == model.num_layers(),
           "partition of {} layers for a model of {} layers", partition.num_layers(),
           model.num_layers());
  AP_CHECK(stage_ >= 0 && stage_ < partition.stages(), "stage {} of {}", stage_,
           partition.stages());
  AP_CHECK(options.B >= 1 && options.T >= 1 && options.T <= model.options().context,
           "B = {}, T = {} (context {})", options.B, options.T, model.options().context);
  AP_CHECK(options.microbatches >= 1, "microbatches = {}", options.microbatches);
  AP_CHECK(optimizer.kind == "adamw" || optimizer.kind == "sgd", "optimizer.kind = \"{}\"",
           optimizer.kind);
  first_ = partition.begin(stage_);
  update_mbs_ = options.mode == Mode::pipedream ? 1 : options.microbatches;
  const int d = partition.stages();
  const int L = partition.size(stage_);
  const size_t bth = static_cast<size_t>(options.B) * options.T * model.options().width;

  // layers, parameter / gradient layout
  std::vector<size_t> layer_floats;
  size_t params = 0, saved = 0;
  std::vector<size_t> saved_off;
  for (int i = 0; i < L; ++i) {
    layers_.push_back(model.layer_ptr(first_ + i));
    const Layer& layer = *layers_.back();
    layer_floats.push_back(layer.param_floats());
    param_off_.push_back(params);
    saved_off.push_back(saved);
    params += layer.param_floats();
    saved += layer.saved_floats(options.B, options.T);
  }
  saved_off.push_back(saved);
  saved_off_ = std::move(saved_off);
  // a second gradient buffer only when backwards can run while an update is open
  const int versions = version_capacity(options.mode, d, stage_);
  grad_buf_[0].assign(params, 0.0f);
  if (versions > 1) grad_buf_[1].assign(params, 0.0f);
  grads_ = grad_buf_[0].data();
  if (version_policy(options.mode) == VersionPolicy::predicted) predicted_.assign(params, 0.0f);

  // activation stash
  const int slots = options.stash_slots > 0
                        ? options.stash_slots
                        : default_stash_slots(options.mode, d, stage_, options.microbatches);
  stash_.resize(static_cast<size_t>(std::max(slots, 1)));
  for (Slot& s : stash_) {
    s.hidden.assign(static_cast<size_t>(L - 1) * bth, 0.0f);
    s.saved.assign(saved, 0.0f);
  }
  dh_a_.assign(bth, 0.0f);
  dh_b_.assign(bth, 0.0f);
  const std::vector<int64_t> hidden_shape{options.B, options.T, model.options().width};
  out_pool_ = std::make_unique<TensorPool>(hidden_shape, is_last() ? 0 : stash_slots() + 1);
  din_pool_ = std::make_unique<TensorPool>(hidden_shape, is_first() ? 0 : 2);

  // weight versions, initialised from the model's seeded init
  store_ = std::make_unique<WeightStore>(version_policy(options.mode), versions,
                                         std::move(layer_floats), stash_slots());
  for (int i = 0; i < L; ++i) model.init_layer(first_ + i, store_->mutable_params(0, i).data());

  // the update job's layout: per-slot update rules, tied parameters
  job_.model_ = &model_;
  job_.stage_ = stage_;
  job_.first_ = first_;
  job_.layers_ = layers_;
  job_.offsets_ = param_off_;
  job_.sumsq_.assign(static_cast<size_t>(L), 0.0);
  job_.params_.resize(static_cast<size_t>(L));
  std::vector<std::vector<SlotUpdate>>& rules = job_.updates_;
  rules.resize(static_cast<size_t>(L));
  for (int i = 0; i < L; ++i)
    rules[static_cast<size_t>(i)].assign(layers_[static_cast<size_t>(i)]->slots().size(),
                                         SlotUpdate::stage_scale);
  for (const TiedParam& tp : model.tied()) {
    TiedLayout t;
    t.owner_stage = partition.stage_of(tp.owner_layer);
    t.copy_stage = partition.stage_of(tp.copy_layer);
    const ParamSlot* a = model.layer(tp.owner_layer).find_slot(tp.owner_slot);
    const ParamSlot* b = model.layer(tp.copy_layer).find_slot(tp.copy_slot);
    AP_CHECK(a && b && a->numel == b->numel, "tied slots {} / {}", tp.owner_slot, tp.copy_slot);
    AP_CHECK(a->decay == b->decay, "tied slots {} / {} differ in weight decay", tp.owner_slot,
             tp.copy_slot);
    t.numel = a->numel;
    const bool owner = t.owner_stage == stage_, copy = t.copy_stage == stage_;
    t.role = owner && copy ? TiedRole::both
             : owner       ? TiedRole::owner
             : copy        ? TiedRole::copy
                           : TiedRole::none;
    if (owner) {
      t.owner_local = tp.owner_layer - first_;
      t.owner_offset = a->offset;
    }
    if (copy) {
      t.copy_local = tp.copy_layer - first_;
      t.copy_offset = b->offset;
    }
    if (t.role == TiedRole::copy) {
      const auto& slots_of = layers_[static_cast<size_t>(t.copy_local)]->slots();
      for (size_t s = 0; s < slots_of.size(); ++s) {
        if (slots_of[s].name == tp.copy_slot) {
          rules[static_cast<size_t>(t.copy_local)][s] =
              tied_sync_ == TiedSync::follow_owner ? SlotUpdate::skip : SlotUpdate::tied_scale;
        }
      }
    }
    tied_.push_back(t);
    tied_held_.emplace_back();
    tied_held_.back().reserve(static_cast<size_t>(store_->capacity()) + 2);
    tied_held_.back().emplace_back(0, TiedVersion{0, 0});  // both copies: the same init
  }
  job_.tied_ = tied_;
  tied_carried_.assign(tied_.size(), TiedVersion{});
  if (opts_.log_versions) log_.reserve(1024);
}

StageWorker::~StageWorker() = default;

void StageWorker::check_action(const Action& a, ActionKind kind) const {
  AP_CHECK(run_active_, "{}: start_run() first", to_string(a));
  AP_CHECK(pending_ == nullptr,
           "{}: the weight gradients of B{} are pending: exec_backward_weights() first",
           to_string(a), pending_ != nullptr ? pending_->microbatch : -1);
  AP_CHECK(a.kind == kind && a.stage == stage_, "{} given to exec of {} at stage {}", to_string(a),
           to_string(kind), stage_);
  if (is_compute(kind)) {
    AP_CHECK(a.microbatch >= 0 && a.microbatch < run_microbatches_,
             "{}: microbatch outside the run's [0, {})", to_string(a), run_microbatches_);
  }
}

Status StageWorker::start_run(const Schedule& s, int64_t microbatch_offset) {
  if (s.mode != opts_.mode) {
    return make_error("a {} schedule given to a {} stage", to_string(s.mode),
                      to_string(opts_.mode));
  }
  if (s.stages != stages() || static_cast<int>(s.per_stage.size()) != stages()) {
    return make_error("a schedule of {} stages given to a pipeline of {} stages", s.stages,
                      stages());
  }
  if (s.microbatches != update_mbs_) {
    return make_error(
        "the schedule averages {} microbatches per step but stage {} was built for {}",
        s.microbatches, stage_, update_mbs_);
  }
  if (in_flight() > 0) {
    return make_error("stage {}: {} microbatches of the previous run are still in flight", stage_,
                      in_flight());
  }
  if (job_.open()) {
    return make_error("stage {}: the update to version {} is still open (commit it first)", stage_,
                      job_.step());
  }
  const int need = peak_stash(s)[static_cast<size_t>(stage_)];
  if (need > stash_slots()) {
    return make_error(
        "stage {}: the schedule stashes up to {} microbatches but the stage has {} "
        "stash slots",
        stage_, need, stash_slots());
  }
  if (s.continued && !holds_previous()) {
    return make_error(
        "stage {}: a continued 2bw run computes its first step with version {}, which the stage "
        "does not hold (a fresh training, or a resume without it, starts a run that is not "
        "continued)",
        stage_, updates_ - 1);
  }
  base_ = static_cast<int>(updates_);
  if (!s.continued) store_->reset(base_);
  for (auto& held : tied_held_) {
    std::erase_if(held, [&](const auto& e) { return !store_->holds(e.first); });
  }
  for (size_t k = 0; k < tied_.size(); ++k) {
    if (tied_[k].role == TiedRole::copy && tied_sync_ == TiedSync::follow_owner &&
        tied_held(base_, k) != TiedVersion{base_, 0}) {
      return make_error(
          "stage {}: its copy of tied parameter {} holds {}, not the owner's version {}: "
          "install_tied_weights at the end of the previous run",
          stage_, k, to_string(tied_held(base_, k)), base_);
    }
  }
  mb_offset_ = microbatch_offset;
  run_microbatches_ = s.total_microbatches();
  predicted_tied_ = {};
  owner_f_.clear();
  for (const TiedLayout& t : tied_) {
    if (t.role != TiedRole::copy || tied_sync_ != TiedSync::follow_owner) continue;
    owner_f_.assign(static_cast<size_t>(run_microbatches_), TiedVersion{});
    const bool predicts = version_policy(opts_.mode) == VersionPolicy::predicted;
    for (const Action& a : s.per_stage[static_cast<size_t>(t.owner_stage)]) {
      if (a.kind != ActionKind::F || a.microbatch < 0 || a.microbatch >= run_microbatches_)
        continue;
      // the owner predicts only past version 0 (exec_forward): otherwise it uses the version
      const int v = base_ + a.version;
      owner_f_[static_cast<size_t>(a.microbatch)] = {v, predicts && v > 0 ? a.lookahead : 0};
    }
  }
  run_active_ = true;
  return {};
}

StageWorker::Slot& StageWorker::acquire_slot(int microbatch) {
  Slot* free_slot = nullptr;
  for (Slot& s : stash_) {
    AP_CHECK(s.microbatch != microbatch, "F of microbatch {} twice without its B", microbatch);
    if (s.microbatch < 0 && !free_slot) free_slot = &s;
  }
  AP_CHECK(free_slot, "stage {}: F of microbatch {} but all {} stash slots are in flight", stage_,
           microbatch, stash_.size());
  free_slot->microbatch = microbatch;
  return *free_slot;
}

StageWorker::Slot& StageWorker::find_slot(int microbatch) {
  for (Slot& s : stash_)
    if (s.microbatch == microbatch) return s;
  AP_CHECK(false, "stage {}: B of microbatch {} whose F has not run", stage_, microbatch);
  return stash_.front();
}

int StageWorker::in_flight() const {
  int n = 0;
  for (const Slot& s : stash_) n += s.microbatch >= 0 ? 1 : 0;
  return n;
}

TiedVersion StageWorker::tied_held(int version, size_t k) const {
  for (const auto& [v, tv] : tied_held_[k])
    if (v == version) return tv;
  return {};
}

TiedVersion StageWorker::owner_f_version(const Action& f) const {
  return owner_f_[static_cast<size_t>(f.microbatch)];
}

void StageWorker::set_tied_held(int version, size_t k, TiedVersion tied_version) {
  for (auto& [v, tv] : tied_held_[k]) {
    if (v == version) {
      tv = tied_version;
      return;
    }
  }
  tied_held_[k].emplace_back(version, tied_version);
}

ForwardOutput StageWorker::exec_forward(const Action& a, const Microbatch& mb, const Tensor& in) {
  check_action(a, ActionKind::F);
  AP_CHECK(!waits_for_update(a), "{}: needs the update to version {}, which is not committed",
           to_string(a), job_.step());
  AP_CHECK(mb.B == opts_.B && mb.T == opts_.T,
           "{}: microbatch ({}, {}) but the stage takes ({}, {})", to_string(a), mb.B, mb.T,
           opts_.B, opts_.T);
  const size_t bth = dh_a_.size();
  const Layer& first = *layers_.front();
  if (first.takes_input()) {
    AP_CHECK(in.defined() && in.dtype() == DType::f32 && static_cast<size_t>(in.numel()) == bth,
             "{}: input {} but the stage takes (B,T,C) = {} floats", to_string(a),
             in.defined() ? in.describe() : "undefined", bth);
  }
  const int v = base_ + a.version;
  const bool predicted = store_->policy() == VersionPolicy::predicted;
  if (predicted) {
    AP_CHECK(v == store_->latest(), "{}: forward at version {} but the stage's weights are at {}",
             to_string(a), v, store_->latest());
  }
  TiedVersion tied_version;
  for (size_t k = 0; k < tied_.size(); ++k) {
    if (tied_[k].role != TiedRole::copy || tied_sync_ != TiedSync::follow_owner) continue;
    const TiedVersion need = owner_f_version(a);
    AP_CHECK(tied_held(v, k) == need,
             "{}: the tied parameter must be at {} (the owner's) but holds {}: "
             "install_tied_weights first",
             to_string(a), to_string(need), to_string(tied_held(v, k)));
    tied_version = need;
  }
  Slot& slot = acquire_slot(a.microbatch);
  slot.version = v;
  slot.input = first.takes_input() ? in : Tensor();
  if (!predicted) store_->bind(a.microbatch, v);
  const bool predict = predicted && a.lookahead > 0 && updates_ > 0;
  // a copy that follows its owner computes with the tied value it installed, never predicts it
  // (the copy is the model's last layer, at the last stage, whose lookahead is always 0)
  AP_CHECK(!predict || tied_version.version < 0,
           "{}: stage {} follows a tied owner and cannot predict its copy", to_string(a), stage_);
  predicted_tied_ =
      predict && tied_sync_ == TiedSync::follow_owner ? TiedVersion{v, a.lookahead} : TiedVersion{};

  ForwardOutput result;
  if (!layers_.back()->is_loss()) result.out = out_pool_->acquire();
  const int L = num_layers();
  for (int i = 0; i < L; ++i) {
    const size_t k = static_cast<size_t>(i);
    const Layer& layer = *layers_[k];
    const float* P = store_->params(v, i).data();
    if (predict) {
      AP_CHECK(moments_,
               "{}: an xpipe forward predicts from the optimizer moments: predict_from() "
               "first",
               to_string(a));
      float* y = predicted_.data() + param_off_[k];
      predict_weights(ctx_, opt_, layer, P, moments_->state(i).data(), updates_, a.lookahead, y);
      P = y;
    }
    ctx_.arena().reset();
    const float* x = i > 0 ? slot.hidden.data() + (k - 1) * bth
                           : (layer.takes_input() ? slot.input.f32() : nullptr);
    float* y =
        i + 1 < L ? slot.hidden.data() + k * bth : (layer.is_loss() ? nullptr : result.out.f32());
    const LossStats st = layer.forward(ctx_, P, mb, x, y, slot.saved.data() + saved_off_[k]);
    if (layer.is_loss()) result.loss = st;
  }
  slot.loss = result.loss;
  if (opts_.log_versions) {
    log_.push_back({stage_, ActionKind::F, mb_offset_ + a.microbatch, v,
                    predicted ? a.lookahead : 0, tied_version.version, tied_version.lookahead});
  }
  return result;
}

Tensor StageWorker::exec_backward(const Action& a, const Microbatch& mb, const Tensor& dout) {
  Tensor din = backward_layers(a, mb, dout, nullptr);
  finish_backward();
  return din;
}

Tensor StageWorker::exec_backward_input(const Action& a, const Microbatch& mb, const Tensor& dout) {
  later_.clear();  // nothing left over from a backward that threw halfway
  return backward_layers(a, mb, dout, &later_);
}

void StageWorker::exec_backward_weights() {
  AP_CHECK(pending_ != nullptr, "stage {}: exec_backward_weights() without exec_backward_input()",
           stage_);
  later_.run(ctx_);
  finish_backward();
}

Tensor StageWorker::backward_layers(const Action& a, const Microbatch& mb, const Tensor& dout,
                                    DeferredGrads* later) {
  check_action(a, ActionKind::B);
  AP_CHECK(!waits_for_update(a), "{}: needs the update to version {}, which is not committed",
           to_string(a), job_.step());
  AP_CHECK(mb.B == opts_.B && mb.T == opts_.T,
           "{}: microbatch ({}, {}) but the stage takes ({}, {})", to_string(a), mb.B, mb.T,
           opts_.B, opts_.T);
  const size_t bth = dh_a_.size();
  Slot& slot = find_slot(a.microbatch);
  const int v = base_ + a.version;
  const bool predicted = store_->policy() == VersionPolicy::predicted;
  if (predicted) {
    AP_CHECK(v == store_->latest(), "{}: backward at version {} but the stage's weights are at {}",
             to_string(a), v, store_->latest());
  } else {
    AP_CHECK(store_->bound_version(a.microbatch) == v,
             "{}: backward at version {} but its forward used version {}", to_string(a), v,
             store_->bound_version(a.microbatch));
  }
  const Layer& last = *layers_.back();
  if (!last.is_loss()) {
    AP_CHECK(
        dout.defined() && dout.dtype() == DType::f32 && static_cast<size_t>(dout.numel()) == bth,
        "{}: output gradient {} but the stage produces (B,T,C) = {} floats", to_string(a),
        dout.defined() ? dout.describe() : "undefined", bth);
  }
  Tensor din;
  if (layers_.front()->takes_input()) din = din_pool_->acquire();
  const float dloss = loss_scale(slot.loss.count, update_mbs_);
  const float* dcur = last.is_loss() ? nullptr : dout.f32();
  for (int i = num_layers() - 1; i >= 0; --i) {
    const size_t k = static_cast<size_t>(i);
    const Layer& layer = *layers_[k];
    float* dnext = i > 0 ? (dcur == dh_a_.data() ? dh_b_.data() : dh_a_.data())
                         : (layer.takes_input() ? din.f32() : nullptr);
    const float* x = i > 0 ? slot.hidden.data() + (k - 1) * bth
                           : (layer.takes_input() ? slot.input.f32() : nullptr);
    ctx_.arena().reset();
    layer.backward(ctx_, store_->params(v, i).data(), grads_ + param_off_[k], mb, x,
                   slot.saved.data() + saved_off_[k], dcur, dnext, dloss, later);
    dcur = dnext;
  }
  pending_ = &slot;
  pending_action_ = a;
  return din;
}

void StageWorker::finish_backward() {
  Slot& slot = *pending_;
  const Action& a = pending_action_;
  const int v = base_ + a.version;
  if (opts_.log_versions) {
    TiedVersion tied_version;
    for (size_t k = 0; k < tied_.size(); ++k)
      if (tied_[k].role == TiedRole::copy && tied_sync_ == TiedSync::follow_owner)
        tied_version = tied_held(v, k);
    log_.push_back({stage_, ActionKind::B, mb_offset_ + a.microbatch, v, 0, tied_version.version,
                    tied_version.lookahead});
  }
  if (store_->policy() != VersionPolicy::predicted) store_->release(a.microbatch);
  slot.microbatch = -1;
  slot.input = Tensor();
  pending_ = nullptr;
}

UpdateJob& StageWorker::begin_update(const Action& a) {
  check_action(a, ActionKind::OPT_STEP);
  AP_CHECK(!job_.open(), "{}: the update to version {} is still open", to_string(a), job_.step());
  AP_CHECK(base_ + a.version == updates_ + 1, "{}: produces version {} but the stage is at {}",
           to_string(a), base_ + a.version, updates_);
  // the copy slot of a follow_owner copy is not updated: the new version holds what the newest
  // one holds now
  for (size_t k = 0; k < tied_.size(); ++k) tied_carried_[k] = tied_held(store_->latest(), k);
  store_->begin_update();
  for (int i = 0; i < num_layers(); ++i)
    job_.params_[static_cast<size_t>(i)] = store_->update_params(i);
  // the job takes the accumulated gradients; later backwards accumulate into the other
  // (zeroed) buffer, when there is one
  job_.grads_ = grads_;
  if (!grad_buf_[1].empty())
    grads_ = grads_ == grad_buf_[0].data() ? grad_buf_[1].data() : grad_buf_[0].data();
  job_.step_ = updates_ + 1;
  job_.open_ = true;
  job_.finished_ = false;
  job_.applied_ = false;
  return job_;
}

void StageWorker::commit_update(UpdateJob& job) {
  AP_CHECK(&job == &job_ && job_.open(), "stage {}: commit of an update it did not begin", stage_);
  AP_CHECK(job_.applied(), "stage {}: commit of the update to version {} before it was applied",
           stage_, job_.step());
  store_->commit_update();
  ++updates_;
  for (size_t k = 0; k < tied_.size(); ++k) {
    auto& held = tied_held_[k];
    std::erase_if(held, [&](const auto& e) { return !store_->holds(e.first); });
    if (tied_[k].role == TiedRole::copy && tied_sync_ == TiedSync::follow_owner) {
      set_tied_held(store_->latest(), k, tied_carried_[k]);
    } else {
      set_tied_held(store_->latest(), k, TiedVersion{static_cast<int>(updates_), 0});
    }
  }
  job_.open_ = false;
  job_.grads_ = nullptr;
  for (auto& p : job_.params_) p = {};
}

bool StageWorker::waits_for_update(const Action& a) const {
  if (!job_.open()) return false;
  const bool in_place = store_->capacity() == 1;  // single, predicted, a ring of one
  switch (a.kind) {
    case ActionKind::OPT_STEP:
      return true;
    case ActionKind::F:
      return in_place || !store_->holds(base_ + a.version);
    case ActionKind::B:
      return in_place || grad_buf_[1].empty();
    default:
      return false;
  }
}

void StageWorker::predict_from(const OptimizerShard& shard) {
  AP_CHECK(shard.stage() == stage_ && shard.first_layer() == first_ &&
               shard.num_layers() == num_layers(),
           "stage {} predicts from the optimizer shard of stage {}", stage_, shard.stage());
  moments_ = &shard;
}

void StageWorker::exec_flush(const Action& a) {
  check_action(a, ActionKind::FLUSH);
  AP_CHECK(in_flight() == 0, "{}: {} microbatches still in flight at a flush", to_string(a),
           in_flight());
}

size_t StageWorker::num_tied() const {
  return tied_.size();
}

int StageWorker::stash_slots() const {
  return static_cast<int>(stash_.size());
}

TiedRole StageWorker::tied_role(size_t k) const {
  AP_CHECK(k < tied_.size(), "tied parameter {} of {}", k, tied_.size());
  return tied_[k].role;
}

std::span<const float> StageWorker::tied_weights(size_t k) const {
  const TiedRole role = tied_role(k);
  AP_CHECK(role == TiedRole::owner || role == TiedRole::both,
           "stage {} does not own tied parameter {}", stage_, k);
  const TiedLayout& t = tied_[k];
  return store_->params(store_->latest(), t.owner_local).subspan(t.owner_offset, t.numel);
}

TiedVersion StageWorker::tied_version_needed(const Action& f, size_t k) const {
  check_action(f, ActionKind::F);
  if (tied_role(k) != TiedRole::copy || tied_sync_ != TiedSync::follow_owner) return {};
  const TiedVersion need = owner_f_version(f);
  return tied_held(base_ + f.version, k) == need ? TiedVersion{} : need;
}

void StageWorker::install_tied_weights(const Action& f, size_t k, TiedVersion version,
                                       std::span<const float> w) {
  const TiedVersion need = tied_version_needed(f, k);
  AP_CHECK(need.valid() && need == version, "{}: tied version {} offered, {} needed", to_string(f),
           to_string(version), to_string(need));
  const TiedLayout& t = tied_[k];
  AP_CHECK(w.size() == t.numel, "tied weights of {} floats, expected {}", w.size(), t.numel);
  const int v = base_ + f.version;
  std::span<float> dst = store_->mutable_params(v, t.copy_local).subspan(t.copy_offset, t.numel);
  std::copy(w.begin(), w.end(), dst.begin());
  set_tied_held(v, k, version);
}

StageWorker::PredictedTied StageWorker::predicted_tied(size_t k) const {
  const TiedRole role = tied_role(k);
  if (role != TiedRole::owner || !predicted_tied_.valid()) return {};
  const TiedLayout& t = tied_[k];
  const size_t off = param_off_[static_cast<size_t>(t.owner_local)] + t.owner_offset;
  return {predicted_tied_, std::span<const float>(predicted_).subspan(off, t.numel)};
}

void StageWorker::install_tied_weights(size_t k, int version, std::span<const float> w) {
  AP_CHECK(tied_role(k) == TiedRole::copy && tied_sync_ == TiedSync::follow_owner,
           "stage {} does not follow an owner for tied parameter {}", stage_, k);
  AP_CHECK(in_flight() == 0 && !job_.open(),
           "stage {}: tied weights installed at rest with {} in flight", stage_, in_flight());
  const bool previous = version == static_cast<int>(updates_) - 1 && holds_previous();
  AP_CHECK(version == static_cast<int>(updates_) || previous,
           "stage {}: tied version {} installed at rest, the stage is at version {}", stage_,
           version, updates_);
  const TiedLayout& t = tied_[k];
  AP_CHECK(w.size() == t.numel, "tied weights of {} floats, expected {}", w.size(), t.numel);
  const int v = previous ? version : store_->latest();
  std::span<float> dst = store_->mutable_params(v, t.copy_local).subspan(t.copy_offset, t.numel);
  std::copy(w.begin(), w.end(), dst.begin());
  set_tied_held(v, k, TiedVersion{version, 0});
}

void StageWorker::set_updates(long updates) {
  AP_CHECK(in_flight() == 0 && !job_.open(), "stage {}: set_updates while busy", stage_);
  AP_CHECK(updates >= 0, "updates = {}", updates);
  for (size_t k = 0; k < tied_.size(); ++k) {
    const TiedVersion tv = tied_held(store_->latest(), k);
    tied_held_[k].clear();
    // a copy following its owner keeps its relative lag; every other side is current
    tied_held_[k].emplace_back(static_cast<int>(updates),
                               tv == TiedVersion{store_->latest(), 0}
                                   ? TiedVersion{static_cast<int>(updates), 0}
                                   : TiedVersion{});
  }
  store_->reset(static_cast<int>(updates));
  updates_ = updates;
  base_ = static_cast<int>(updates);
}

bool StageWorker::holds_previous() const {
  return version_policy(opts_.mode) == VersionPolicy::double_buffered && updates_ >= 1 &&
         store_->holds(static_cast<int>(updates_) - 1);
}

std::span<float> StageWorker::mutable_previous_params(int i) {
  AP_CHECK(version_policy(opts_.mode) == VersionPolicy::double_buffered,
           "stage {}: only 2bw keeps a previous version across runs, not {}", stage_,
           to_string(opts_.mode));
  AP_CHECK(in_flight() == 0 && !job_.open() && updates_ >= 1,
           "stage {}: the previous version is written while busy or at version {}", stage_,
           updates_);
  const int prev = static_cast<int>(updates_) - 1;
  if (!store_->holds(prev)) {
    store_->add_older(prev);
    // a copy following its owner gets the owner's previous version installed at rest
    for (size_t k = 0; k < tied_.size(); ++k) {
      const bool follows = tied_[k].role == TiedRole::copy && tied_sync_ == TiedSync::follow_owner;
      set_tied_held(prev, k, follows ? TiedVersion{} : TiedVersion{prev, 0});
    }
  }
  return store_->mutable_params(prev, i);
}

std::span<const float> StageWorker::tied_weights(size_t k, int version) const {
  const TiedRole role = tied_role(k);
  AP_CHECK(role == TiedRole::owner || role == TiedRole::both,
           "stage {} does not own tied parameter {}", stage_, k);
  const TiedLayout& t = tied_[k];
  return store_->params(version, t.owner_local).subspan(t.owner_offset, t.numel);
}

std::span<const float> StageWorker::params(int i) const {
  return store_->params(store_->latest(), i);
}

std::span<float> StageWorker::mutable_params(int i) {
  AP_CHECK(in_flight() == 0, "stage {}: parameters written with {} microbatches in flight", stage_,
           in_flight());
  return store_->mutable_params(store_->latest(), i);
}

std::span<const float> StageWorker::grads(int i) const {
  AP_CHECK(i >= 0 && i < num_layers(), "layer {} of {}", i, num_layers());
  const size_t k = static_cast<size_t>(i);
  return {grads_ + param_off_[k], layers_[k]->param_floats()};
}

}  // namespace actorpipe
