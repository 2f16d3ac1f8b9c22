// StageWorker: the compute unit of one pipeline stage (its layers' weight versions, gradients,
// activation stash and Context) with one exec_* call per action kind and the update hand-off.
#include "engine/execution/stage_worker.hpp"

#include <algorithm>
#include <utility>

#include "engine/execution/layer_optimizer.hpp"
#include "engine/execution/optimizer_shard.hpp"
#include "engine/execution/xpipe_prediction.hpp"
#include "engine/schedule/simulator.hpp"
#include "kernels/check.hpp"
#include "kernels/compute_backend.hpp"

namespace actorpipe {

bool clips_globally(Mode mode) {
  return is_synchronous(mode);
}

namespace {

// The ranges a bf16 weight stash keeps in bf16 only: the product operands of the stage's layers
// [first, first + L), except tied slots (their owner's and copy's values travel between stages
// in f32 and are written into stashed versions at rest).
std::vector<StashRange> bf16_stash_ranges(const Model& model, int first, int L) {
  std::vector<StashRange> out;
  for (int i = 0; i < L; ++i) {
    const auto& slots = model.layer(first + i).slots();
    for (size_t s = 0; s < slots.size(); ++s) {
      if (slots[s].product_operand && !model.is_tied(first + i, s))
        out.push_back({i, slots[s].offset, slots[s].numel});
    }
  }
  return out;
}

}  // namespace

Status check_stage_backend(const StageWorkerOptions& options) {
  const ComputeBackend* b = options.backend;
  if (b == nullptr || b->host_memory()) return {};
  // what still reads or writes the stage's buffers on the host
  if (options.bf16_stash) {
    return make_error(
        "stage {} on {}: a bf16 weight stash keeps its weights in host memory; not on this "
        "backend",
        options.stage, b->name());
  }
  return {};
}

// ---------------------------------------------------------------------------------------------

StageWorker::StageWorker(const Model& model, const Partition& partition,
                         const OptimizerOptions& optimizer, const StageWorkerOptions& options,
                         ScratchPool* scratch_pool)
    : model_(model),
      partition_(partition),
      opt_(optimizer),
      opts_(options),
      stage_(options.stage),
      ctx_(options.threads) {
  ctx_.set_precision(options.precision);
  if (options.backend != nullptr) {
    const Status ok = check_stage_backend(options);
    AP_CHECK(ok.ok(), "{}", ok.ok() ? "" : ok.error().message);
    ctx_.set_backend(options.backend);
    memory_ = options.backend;
  }
  if (!memory_->host_memory()) {
    // bf16 off the host: the backend rounds each product's operands itself, so no bf16 copies
    // of the weights (host memory) and the activations stay f32 (the same values)
    opts_.bf16_weight_copies = false;
    opts_.bf16_activations = false;
  }
  ctx_.set_bf16_activations(opts_.bf16_activations);
  AP_CHECK(partition.num_layers() == model.num_layers(),
           "partition of {} layers for a model of {} layers", partition.num_layers(),
           model.num_layers());
  AP_CHECK(stage_ >= 0 && stage_ < partition.stages(), "stage {} of {}", stage_,
           partition.stages());
  AP_CHECK(options.B >= 1 && options.T >= 1 && options.T <= model.options().context,
           "B = {}, T = {} (context {})", options.B, options.T, model.options().context);
  AP_CHECK(options.microbatches >= 1, "microbatches = {}", options.microbatches);
  AP_CHECK(options.replicas >= 1, "replicas = {}", options.replicas);
  AP_CHECK(optimizer.kind == "adamw" || optimizer.kind == "sgd", "optimizer.kind = \"{}\"",
           optimizer.kind);
  first_ = partition.begin(stage_);
  update_mbs_ = options.mode == Mode::pipedream ? 1 : options.microbatches;
  const int d = partition.stages();
  const int L = partition.size(stage_);
  bth_ = static_cast<size_t>(options.B) * options.T * model.options().width;

  AP_CHECK(options.recompute.empty() ||
               options.recompute.size() == static_cast<size_t>(model.num_layers()),
           "recompute flags for {} layers, the model has {}", options.recompute.size(),
           model.num_layers());
  const bool predicted_policy = version_policy(options.mode) == VersionPolicy::predicted;

  // layers, parameter / gradient layout; saved activations in the stash (kept) or in the
  // recompute scratch (recomputed)
  std::vector<size_t> layer_floats;
  size_t params = 0, saved = 0, scratch = 0, weights = 0;
  for (int i = 0; i < L; ++i) {
    layers_.push_back(model.layer_ptr(first_ + i));
    const Layer& layer = *layers_.back();
    const bool rc =
        !options.recompute.empty() && options.recompute[static_cast<size_t>(first_ + i)];
    recompute_.push_back(rc);
    layer_floats.push_back(layer.param_floats());
    param_off_.push_back(params);
    params += layer.param_floats();
    const size_t n = layer.saved_floats_for(options.B, options.T, ctx_.bf16_activations());
    saved_off_.push_back(rc ? scratch : saved);
    (rc ? scratch : saved) += n;
    weight_off_.push_back(weights);
    // xpipe's forward may compute with a prediction, and its backward with a later version
    // (updated in place): the recompute needs the forward's weights, kept per microbatch
    if (rc && predicted_policy) weights += layer.param_floats();
  }
  recompute_floats_ = scratch;
  // a second gradient buffer only when backwards can run while an update is open
  const int versions = version_capacity(options.mode, d, stage_);
  grad_buf_[0] = BackendBuffer(*memory_, params);
  if (versions > 1) grad_buf_[1] = BackendBuffer(*memory_, params);
  grads_ = grad_buf_[0].data();
  if (predicted_policy) predicted_ = BackendBuffer(*memory_, params);
  if (predicted_policy) directions_.resize(layers_.size());
  // the dc and secant corrections' Δ = W_now − W_stale, made when an update begins (2bw, pipedream:
  // the stale version is still stored then)
  if (needs_weight_change(optimizer) && !predicted_policy)
    weight_change_ = BackendBuffer(*memory_, params);

  // activation stash
  const int slots = options.stash_slots > 0
                        ? options.stash_slots
                        : default_stash_slots(options.mode, d, stage_, options.microbatches);
  const bool host = memory_->host_memory();
  const bool takes_input = layers_.front()->takes_input();
  stash_ = ActivationStash(stage_, slots, static_cast<size_t>(L - 1) * bth_, saved, weights,
                           scratch_pool, *memory_, !host && takes_input ? bth_ : 0);
  if (!host) {
    edge_out_ = BackendBuffer(*memory_, bth_);
    edge_in_ = BackendBuffer(*memory_, bth_);
  }
  take_scratch_buffers(scratch_pool);
  // the tensors that leave the stage stay on its device (in its lasting memory, which outlives
  // the stage: a tensor may still be in flight when the stage is rebuilt)
  BackendMemory* edges = host ? nullptr : &memory_->lasting_memory();
  make_edge_pools(edges, edges);

  // weight versions, initialised from the model's seeded init
  std::vector<StashRange> bf16_stash;
  if (options.bf16_stash) {
    AP_CHECK(options.precision == Precision::bf16 && opts_.bf16_weight_copies,
             "stage {}: a bf16 weight stash needs bf16 products with weight copies", stage_);
    AP_CHECK(
        !needs_weight_change(optimizer),
        "stage {}: a bf16 weight stash cannot serve a dc or secant correction's Δ, which reads the "
        "stale version in f32",
        stage_);
    bf16_stash = bf16_stash_ranges(model, first_, L);
  }
  store_ =
      std::make_unique<WeightStore>(version_policy(options.mode), versions, std::move(layer_floats),
                                    stash_slots(), std::move(bf16_stash), *memory_);
  if (options.init_params) {
    std::vector<float> init;
    for (int i = 0; i < L; ++i) {
      const std::span<float> p = store_->mutable_params(0, i);
      if (host) {
        model.init_layer(first_ + i, p.data());
      } else {
        init.assign(p.size(), 0.0f);
        model.init_layer(first_ + i, init.data());
        memory_->to_backend(p.data(), init.data(), p.size());
      }
    }
  }
  if (options.precision == Precision::bf16 && opts_.bf16_weight_copies) {
    for (int b = 0; b < store_->capacity(); ++b)
      for (int i = 0; i < L; ++i) bf16_weights_.cover(store_->buffer(b, i));
    if (store_->bf16_stash()) {
      bf16_weights_.set_source([store = store_.get()](const float* w, int64_t n) {
        return store->stashed_bf16(w, static_cast<size_t>(n));
      });
    }
    ctx_.set_bf16_weights(&bf16_weights_);
  }

  // the update job's layout: per-slot update rules, tied parameters
  job_.model_ = &model_;
  job_.memory_ = memory_;
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
  tied_ = TiedParams(model, partition, stage_, options.mode, store_->capacity());
  for (size_t k = 0; k < tied_.size(); ++k) {
    const TiedLayout& t = tied_.layout(k);
    if (t.role != TiedRole::copy) continue;
    const std::string& copy_slot = model.tied()[k].copy_slot;
    const auto& slots_of = layers_[static_cast<size_t>(t.copy_local)]->slots();
    for (size_t s = 0; s < slots_of.size(); ++s) {
      if (slots_of[s].name == copy_slot) {
        rules[static_cast<size_t>(t.copy_local)][s] =
            tied_.follows(k) ? SlotUpdate::skip : SlotUpdate::tied_scale;
      }
    }
  }
  job_.tied_ = tied_.layouts();
  if (opts_.log_versions) log_.reserve(1024);
}

void StageWorker::repartition(const Partition& partition) {
  AP_CHECK(partition.stages() == partition_.stages() &&
               partition.begin(stage_) == partition_.begin(stage_) &&
               partition.end(stage_) == partition_.end(stage_),
           "stage {} holds layers [{}, {}): a partition that gives it [{}, {}) needs a new worker",
           stage_, partition_.begin(stage_), partition_.end(stage_), partition.begin(stage_),
           partition.end(stage_));
  partition_ = partition;
}

void StageWorker::make_edge_pools(BackendMemory* forward, BackendMemory* backward) {
  const std::vector<int64_t> hidden_shape{opts_.B, opts_.T, model_.options().width};
  out_pool_ = std::make_unique<TensorPool>(hidden_shape, is_last() ? 0 : stash_slots() + 1,
                                           DType::f32, forward);
  din_pool_ = std::make_unique<TensorPool>(hidden_shape, is_first() ? 0 : 2, DType::f32, backward);
}

void StageWorker::set_edge_memory(BackendMemory* forward, BackendMemory* backward) {
  if (!memory_->host_memory()) return;
  if (out_pool_->memory() == forward && din_pool_->memory() == backward) return;
  make_edge_pools(forward, backward);
}

StageWorker::~StageWorker() = default;

void StageWorker::take_scratch_buffers(ScratchPool* pool) {
  // after the stash's (the largest first: the pool fits the smallest buffer that holds each)
  if (std::find(recompute_.begin(), recompute_.end(), true) != recompute_.end()) {
    assign_zeros(recompute_saved_, *memory_, recompute_floats_, pool);
    assign_zeros(recompute_out_, *memory_, bth_, pool);
  }
  assign_zeros(dh_a_, *memory_, bth_, pool);
  assign_zeros(dh_b_, *memory_, bth_, pool);
}

void StageWorker::give_scratch(ScratchPool& pool) {
  AP_CHECK(in_flight() == 0 && !job_.open() && pending_ == nullptr,
           "stage {}: scratch buffers given away while busy ({} microbatches in flight{})", stage_,
           in_flight(), job_.open() ? ", an update open" : "");
  AP_CHECK(holds_scratch(), "stage {}: scratch buffers given away twice", stage_);
  stash_.give_buffers(pool);
  for (BackendBuffer* v :
       {&recompute_saved_, &recompute_out_, &dh_a_, &dh_b_, &eval_hidden_, &eval_saved_})
    pool.give(std::exchange(*v, {}));
}

void StageWorker::take_scratch(ScratchPool& pool) {
  AP_CHECK(!holds_scratch(), "stage {}: take_scratch without give_scratch", stage_);
  stash_.take_buffers(&pool);
  take_scratch_buffers(&pool);
}

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
  if (!holds_scratch()) {
    return make_error("stage {}: its scratch buffers were given away (take_scratch first)", stage_);
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
  tied_.forget_unstored(*store_);
  for (size_t k = 0; k < tied_.size(); ++k) {
    if (tied_.follows(k) && tied_.held(base_, k) != TiedVersion{base_, 0}) {
      return make_error(
          "stage {}: its copy of tied parameter {} holds {}, not the owner's version {}: "
          "install_tied_weights at the end of the previous run",
          stage_, k, to_string(tied_.held(base_, k)), base_);
    }
  }
  mb_offset_ = microbatch_offset;
  run_microbatches_ = s.total_microbatches();
  predicted_tied_ = {};
  tied_.plan_run(s, base_, run_microbatches_,
                 version_policy(opts_.mode) == VersionPolicy::predicted);
  run_active_ = true;
  return {};
}

Status StageWorker::shorten_run(const Schedule& s) {
  if (!run_active_) return make_error("stage {}: no run to shorten", stage_);
  if (s.mode != opts_.mode || s.stages != stages() || s.microbatches != update_mbs_) {
    return make_error(
        "stage {}: a {} schedule of {} stages and {} microbatches per step cannot "
        "shorten this stage's {} run",
        stage_, to_string(s.mode), s.stages, s.microbatches, to_string(opts_.mode));
  }
  if (s.total_microbatches() > run_microbatches_) {
    return make_error("stage {}: a run of {} microbatches cannot be shortened to {}", stage_,
                      run_microbatches_, s.total_microbatches());
  }
  run_microbatches_ = s.total_microbatches();
  // the owner's forwards of the remaining microbatches are the same actions in both schedules
  tied_.plan_run(s, base_, run_microbatches_,
                 version_policy(opts_.mode) == VersionPolicy::predicted);
  return {};
}

int StageWorker::in_flight() const {
  return stash_.in_flight();
}

ForwardOutput StageWorker::exec_forward(const Action& a, const Microbatch& mb, const Tensor& in) {
  check_action(a, ActionKind::F);
  AP_CHECK(!waits_for_update(a), "{}: needs the update to version {}, which is not committed",
           to_string(a), job_.step());
  AP_CHECK(mb.B == opts_.B && mb.T == opts_.T,
           "{}: microbatch ({}, {}) but the stage takes ({}, {})", to_string(a), mb.B, mb.T,
           opts_.B, opts_.T);
  const size_t bth = bth_;
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
    if (!tied_.follows(k)) continue;
    const TiedVersion need = tied_.owner_forward(a.microbatch);
    AP_CHECK(tied_.held(v, k) == need,
             "{}: the tied parameter must be at {} (the owner's) but holds {}: "
             "install_tied_weights first",
             to_string(a), to_string(need), to_string(tied_.held(v, k)));
    tied_version = need;
  }
  Slot& slot = stash_.acquire(a.microbatch);
  slot.version = v;
  // on the host the slot holds the input tensor (a host copy of one in a device's memory); off
  // it, the input's copy in the stage's memory
  const bool host = memory_->host_memory();
  slot.input = first.takes_input() && host ? host_copy(in) : Tensor();
  const float* input = !first.takes_input() ? nullptr
                       : host               ? slot.input.f32()
                                            : stage_in(in, slot.input_copy);
  if (!predicted) store_->bind(a.microbatch, v);
  const bool predict = predicted && a.lookahead > 0 && updates_ > 0;
  // a copy that follows its owner computes with the tied value it installed, never predicts it
  // (the copy is the model's last layer, at the last stage, whose lookahead is always 0)
  AP_CHECK(!predict || tied_version.version < 0,
           "{}: stage {} follows a tied owner and cannot predict its copy", to_string(a), stage_);
  predicted_tied_ = predict && tied_.sync() == TiedSync::follow_owner ? TiedVersion{v, a.lookahead}
                                                                      : TiedVersion{};

  ForwardOutput result;
  if (!layers_.back()->is_loss()) result.out = out_pool_->acquire();
  store_->settle();
  sync_bf16_copies();
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
      predict_weights(ctx_, opt_, layer, P, moments_->state(i).data(), updates_, a.lookahead, y,
                      &directions_[k]);
      P = y;
    }
    if (recompute_[k] && predicted) {
      memory_->copy(slot.weights.data() + weight_off_[k], P, layer.param_floats());
    }
    reset_scratch();
    const float* x = i > 0 ? slot.hidden.data() + (k - 1) * bth : input;
    float* y = i + 1 < L ? slot.hidden.data() + k * bth
                         : (layer.is_loss() ? nullptr : stage_out(result.out, edge_out_));
    // a recomputed layer's saved activations go to the scratch, dead once the forward is done
    const LossStats st = layer.forward(ctx_, P, mb, x, y, saved_of(slot, i));
    if (layer.is_loss()) result.loss = st;
  }
  if (result.out.defined()) finish_out(result.out, edge_out_);
  slot.loss = result.loss;
  if (opts_.log_versions) {
    log_.push_back({stage_, ActionKind::F, mb_offset_ + a.microbatch, v,
                    predicted ? a.lookahead : 0, tied_version.version, tied_version.lookahead});
  }
  return result;
}

ForwardOutput StageWorker::evaluate(const Microbatch& mb, const Tensor& in) {
  AP_CHECK(holds_scratch(), "stage {}: evaluate() while its scratch buffers are given away",
           stage_);
  AP_CHECK(in_flight() == 0, "stage {}: evaluate() with {} microbatches in flight", stage_,
           in_flight());
  AP_CHECK(mb.B == opts_.B && mb.T == opts_.T,
           "evaluate: microbatch ({}, {}) but the stage takes ({}, {})", mb.B, mb.T, opts_.B,
           opts_.T);
  const size_t bth = bth_;
  const Layer& first = *layers_.front();
  if (first.takes_input()) {
    AP_CHECK(in.defined() && in.dtype() == DType::f32 && static_cast<size_t>(in.numel()) == bth,
             "evaluate: input {} but the stage takes (B,T,C) = {} floats",
             in.defined() ? in.describe() : "undefined", bth);
  }
  if (eval_hidden_.empty()) {
    size_t saved = 0;
    for (const auto& layer : layers_)
      saved = std::max(saved, layer->saved_floats_for(opts_.B, opts_.T, ctx_.bf16_activations()));
    eval_hidden_ = BackendBuffer(*memory_, 2 * bth);
    eval_saved_ = BackendBuffer(*memory_, std::max<size_t>(saved, 1));
  }
  ForwardOutput result;
  if (!layers_.back()->is_loss())
    result.out = Tensor::zeros({opts_.B, opts_.T, model_.options().width});
  const int L = num_layers();
  const float* x = first.takes_input() ? stage_in(in, edge_in_) : nullptr;
  sync_bf16_copies();
  for (int i = 0; i < L; ++i) {
    const Layer& layer = *layers_[static_cast<size_t>(i)];
    float* y = i + 1 < L ? eval_hidden_.data() + static_cast<size_t>(i % 2) * bth
                         : (layer.is_loss() ? nullptr : stage_out(result.out, edge_out_));
    reset_scratch();
    const LossStats st = layer.forward(ctx_, params(i).data(), mb, x, y, eval_saved_.data());
    if (layer.is_loss()) result.loss = st;
    x = y;
  }
  if (result.out.defined()) finish_out(result.out, edge_out_);
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
  later_.run(ctx_, [this](int i) { layer_gradients_final(i); });
  finish_backward();
}

void StageWorker::on_final_gradients(FinalGradients fn) {
  AP_CHECK(!fn || memory_->host_memory(),
           "stage {}: its final gradients lie in the memory of {}, not on the host (replicas "
           "sum them on the host)",
           stage_, memory_->name());
  final_grads_ = std::move(fn);
}

void StageWorker::layer_gradients_final(int i) {
  if (!final_backward_ || !final_grads_) return;
  const size_t k = static_cast<size_t>(i);
  const size_t n = layers_[k]->param_floats();
  if (n == 0) return;
  // while an update is open, backwards accumulate for the one after it (2bw)
  const long step = static_cast<long>(updates_) + (job_.open() ? 2 : 1);
  final_grads_(i, step, {grads_ + param_off_[k], n});
}

Tensor StageWorker::backward_layers(const Action& a, const Microbatch& mb, const Tensor& dout,
                                    DeferredGrads* later) {
  check_action(a, ActionKind::B);
  AP_CHECK(!waits_for_update(a), "{}: needs the update to version {}, which is not committed",
           to_string(a), job_.step());
  AP_CHECK(mb.B == opts_.B && mb.T == opts_.T,
           "{}: microbatch ({}, {}) but the stage takes ({}, {})", to_string(a), mb.B, mb.T,
           opts_.B, opts_.T);
  const size_t bth = bth_;
  Slot& slot = stash_.find(a.microbatch);
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
  const float dloss = loss_scale(slot.loss.count, update_mbs_ * opts_.replicas);
  final_backward_ = backwards_since_update_ + 1 == update_mbs_;
  const float* dcur = last.is_loss() ? nullptr : stage_in(dout, edge_in_);
  const float* input = slot.input.defined()
                           ? slot.input.f32()
                           : (slot.input_copy.empty() ? nullptr : slot.input_copy.data());
  store_->settle();
  sync_bf16_copies();
  for (int i = num_layers() - 1; i >= 0; --i) {
    const size_t k = static_cast<size_t>(i);
    const Layer& layer = *layers_[k];
    float* dnext = i > 0 ? (dcur == dh_a_.data() ? dh_b_.data() : dh_a_.data())
                         : (layer.takes_input() ? stage_out(din, edge_out_) : nullptr);
    const float* x = i > 0 ? slot.hidden.data() + (k - 1) * bth : input;
    const float* P = store_->params(v, i).data();
    if (recompute_[k]) {
      // the forward again, from the stashed input with the forward's weights, into the scratch
      // (every recomputed layer has its own part: a deferred weight half may still read it)
      const float* Pf = predicted ? slot.weights.data() + weight_off_[k] : P;
      reset_scratch();
      layer.forward(ctx_, Pf, mb, x, layer.is_loss() ? nullptr : recompute_out_.data(),
                    saved_of(slot, i));
    }
    reset_scratch();
    layer.backward(ctx_, P, grads_ + param_off_[k], mb, x, saved_of(slot, i), dcur, dnext, dloss,
                   later);
    if (later != nullptr) {
      later->mark(i);  // the layer's deferred weight gradients end here
    } else {
      layer_gradients_final(i);
    }
    dcur = dnext;
  }
  if (din.defined()) finish_out(din, edge_out_);
  pending_ = &slot;
  pending_action_ = a;
  return din;
}

void StageWorker::finish_backward() {
  ++backwards_since_update_;
  final_backward_ = false;
  Slot& slot = *pending_;
  const Action& a = pending_action_;
  const int v = base_ + a.version;
  if (opts_.log_versions) {
    TiedVersion tied_version;
    for (size_t k = 0; k < tied_.size(); ++k)
      if (tied_.follows(k)) tied_version = tied_.held(v, k);
    log_.push_back({stage_, ActionKind::B, mb_offset_ + a.microbatch, v, 0, tied_version.version,
                    tied_version.lookahead});
  }
  if (store_->policy() != VersionPolicy::predicted) store_->release(a.microbatch);
  last_backward_version_ = v;
  ActivationStash::release(slot);
  pending_ = nullptr;
}

UpdateJob& StageWorker::begin_update(const Action& a) {
  check_action(a, ActionKind::OPT_STEP);
  AP_CHECK(!job_.open(), "{}: the update to version {} is still open", to_string(a), job_.step());
  AP_CHECK(base_ + a.version == updates_ + 1, "{}: produces version {} but the stage is at {}",
           to_string(a), base_ + a.version, updates_);
  // the copy slot of a follow_owner copy is not updated: the new version holds what the newest
  // one holds now
  tied_.carry(store_->latest());
  job_.change_ = nullptr;
  if (!weight_change_.empty()) {
    // the version this update's gradients were computed at: the last backward's (2bw: every
    // backward of the step; pipedream: the update's one microbatch)
    const int now = store_->latest(), stale = last_backward_version_;
    if (stale >= 0 && stale != now && store_->holds(stale)) {
      for (int i = 0; i < num_layers(); ++i) {
        const std::span<const float> w = store_->params(now, i), w0 = store_->params(stale, i);
        float* out = weight_change_.data() + param_off_[static_cast<size_t>(i)];
        if (memory_->host_memory()) {
          for (size_t e = 0; e < w.size(); ++e) out[e] = w[e] - w0[e];
        } else {
          // on the backend: (−w0) + w, the same bits as w − w0 (negation is exact, and IEEE
          // addition commutes)
          ComputeBackend& b = ctx_.backend();
          const long n = static_cast<long>(w.size());
          b.copy(out, w0.data(), w.size());
          b.scale_inplace(out, -1.0f, n);
          b.accumulate(out, w.data(), n);
        }
      }
      job_.change_ = weight_change_.data();
    }
  }
  // off the host the stage's work is complete before the job goes to whoever applies it (on
  // another stream, maybe: an optimizer shard's companion backend)
  memory_->synchronize();
  store_->begin_update();
  for (int i = 0; i < num_layers(); ++i)
    job_.params_[static_cast<size_t>(i)] = store_->update_params(i);
  reserve_rounded();
  // the job takes the accumulated gradients; later backwards accumulate into the other
  // (zeroed) buffer, when there is one
  job_.grads_ = grads_;
  backwards_since_update_ = 0;
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
  tied_.commit(*store_, updates_);
  if (job_.rounded_written_) {
    // the update wrote the bf16 copies of the new version's product operands in its pass: the
    // products take them instead of converting the weights again
    sync_bf16_copies();
    for (const float* w : rounded_src_) bf16_weights_.mark_current(w);
  }
  job_.open_ = false;
  job_.grads_ = nullptr;
  for (auto& p : job_.params_) p = {};
}

void StageWorker::reset_scratch() {
  ctx_.arena().reset();
  if (!ctx_.host_backend()) ctx_.backend().reset_scratch();
}

namespace {
// the memory a tensor's floats are in
BackendMemory& memory_of(const Tensor& t) {
  return t.memory() != nullptr ? *t.memory() : host_backend_memory();
}
}  // namespace

const float* StageWorker::stage_in(const Tensor& t, BackendBuffer& staging) {
  if (memory_->host_memory()) {
    if (t.host_readable()) return t.f32();
    host_in_ = host_copy(t);  // a device's tensor reaching a stage on the host
    return host_in_.f32();
  }
  transfer(*memory_, staging.data(), memory_of(t), t.f32(), static_cast<size_t>(t.numel()));
  return staging.data();
}

float* StageWorker::stage_out(Tensor& t, BackendBuffer& staging) {
  return memory_->host_memory() ? t.f32() : staging.data();
}

void StageWorker::finish_out(Tensor& t, const BackendBuffer& staging) {
  if (memory_->host_memory()) return;
  transfer(memory_of(t), t.f32(), *memory_, staging.data(), static_cast<size_t>(t.numel()));
}

void StageWorker::sync_bf16_copies() {
  if (ctx_.bf16_weights() != &bf16_weights_) return;  // no copies kept
  for (int b = 0; b < store_->capacity(); ++b) {
    for (int i = 0; i < num_layers(); ++i) {
      const std::span<const float> w = store_->buffer(b, i);
      if (!w.empty()) bf16_weights_.sync(w.data(), store_->generation(b, i));
    }
  }
}

void StageWorker::reserve_rounded() {
  rounded_src_.clear();
  job_.rounded_written_ = false;
  if (!(opts_.precision == Precision::bf16 && opts_.bf16_weight_copies)) {
    job_.rounded_.clear();
    return;
  }
  // the bf16 copies the products of the version produced read: its product operands' (tied
  // slots and what follows an owner excepted, which the products convert when they need them)
  job_.rounded_.resize(static_cast<size_t>(num_layers()));
  for (int i = 0; i < num_layers(); ++i) {
    const size_t k = static_cast<size_t>(i);
    const auto& slots = layers_[k]->slots();
    std::vector<bf16*>& out = job_.rounded_[k];
    out.assign(slots.size(), nullptr);
    for (size_t s = 0; s < slots.size(); ++s) {
      if (!slots[s].product_operand || job_.updates_[k][s] == SlotUpdate::skip) continue;
      const float* w = job_.params_[k].data() + slots[s].offset;
      out[s] = bf16_weights_.reserve(w, static_cast<int64_t>(slots[s].numel));
      rounded_src_.push_back(w);
    }
  }
}

UpdateJob& StageWorker::open_update() {
  AP_CHECK(job_.open(), "stage {}: no update is open", stage_);
  return job_;
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
  return stash_.size();
}

bool StageWorker::recomputes(int i) const {
  AP_CHECK(i >= 0 && i < num_layers(), "layer {} of {}", i, num_layers());
  return recompute_[static_cast<size_t>(i)];
}

size_t StageWorker::recompute_scratch_bytes() const {
  return (recompute_saved_.size() + recompute_out_.size()) * sizeof(float);
}

float* StageWorker::saved_of(Slot& slot, int i) {
  const size_t k = static_cast<size_t>(i);
  return (recompute_[k] ? recompute_saved_.data() : slot.saved.data()) + saved_off_[k];
}

TiedRole StageWorker::tied_role(size_t k) const {
  return tied_.layout(k).role;
}

std::span<const float> StageWorker::tied_weights(size_t k) const {
  const TiedRole role = tied_role(k);
  AP_CHECK(role == TiedRole::owner || role == TiedRole::both,
           "stage {} does not own tied parameter {}", stage_, k);
  const TiedLayout& t = tied_.layout(k);
  return store_->params(store_->latest(), t.owner_local).subspan(t.owner_offset, t.numel);
}

TiedVersion StageWorker::tied_version_needed(const Action& f, size_t k) const {
  check_action(f, ActionKind::F);
  if (!tied_.follows(k)) return {};
  const TiedVersion need = tied_.owner_forward(f.microbatch);
  return tied_.held(base_ + f.version, k) == need ? TiedVersion{} : need;
}

void StageWorker::install_tied_weights(const Action& f, size_t k, TiedVersion version,
                                       std::span<const float> w) {
  const TiedVersion need = tied_version_needed(f, k);
  AP_CHECK(need.valid() && need == version, "{}: tied version {} offered, {} needed", to_string(f),
           to_string(version), to_string(need));
  const TiedLayout& t = tied_.layout(k);
  AP_CHECK(w.size() == t.numel, "tied weights of {} floats, expected {}", w.size(), t.numel);
  const int v = base_ + f.version;
  std::span<float> dst = store_->mutable_params(v, t.copy_local).subspan(t.copy_offset, t.numel);
  memory_->to_backend(dst.data(), w.data(), w.size());
  tied_.set_held(v, k, version);
}

StageWorker::PredictedTied StageWorker::predicted_tied(size_t k) const {
  const TiedRole role = tied_role(k);
  if (role != TiedRole::owner || !predicted_tied_.valid()) return {};
  const TiedLayout& t = tied_.layout(k);
  const size_t off = param_off_[static_cast<size_t>(t.owner_local)] + t.owner_offset;
  return {predicted_tied_, std::span<const float>(predicted_.data() + off, t.numel)};
}

void StageWorker::install_tied_weights(size_t k, int version, std::span<const float> w) {
  AP_CHECK(tied_role(k) == TiedRole::copy && tied_.follows(k),
           "stage {} does not follow an owner for tied parameter {}", stage_, k);
  AP_CHECK(in_flight() == 0 && !job_.open(),
           "stage {}: tied weights installed at rest with {} in flight", stage_, in_flight());
  const bool previous = version == static_cast<int>(updates_) - 1 && holds_previous();
  AP_CHECK(version == static_cast<int>(updates_) || previous,
           "stage {}: tied version {} installed at rest, the stage is at version {}", stage_,
           version, updates_);
  const TiedLayout& t = tied_.layout(k);
  AP_CHECK(w.size() == t.numel, "tied weights of {} floats, expected {}", w.size(), t.numel);
  const int v = previous ? version : store_->latest();
  std::span<float> dst = store_->mutable_params(v, t.copy_local).subspan(t.copy_offset, t.numel);
  memory_->to_backend(dst.data(), w.data(), w.size());
  tied_.set_held(v, k, TiedVersion{version, 0});
}

TiedVersion StageWorker::tied_held(int version, size_t k) const {
  return tied_.held(version, k);
}

void StageWorker::set_updates(long updates) {
  AP_CHECK(in_flight() == 0 && !job_.open(), "stage {}: set_updates while busy", stage_);
  AP_CHECK(updates >= 0, "updates = {}", updates);
  tied_.rename(store_->latest(), static_cast<int>(updates));
  store_->reset(static_cast<int>(updates));
  updates_ = updates;
  for (RotatedDirections& d : directions_) d.clear();  // the state may be another (a load)
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
    tied_.add_previous(prev);
  }
  return store_->mutable_params(prev, i);
}

std::span<const float> StageWorker::tied_weights(size_t k, int version) const {
  const TiedRole role = tied_role(k);
  AP_CHECK(role == TiedRole::owner || role == TiedRole::both,
           "stage {} does not own tied parameter {}", stage_, k);
  const TiedLayout& t = tied_.layout(k);
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
