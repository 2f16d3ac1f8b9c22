// Update job: one optimizer update of a pipeline stage, handed by its StageWorker to whoever
// applies it (the stage's optimizer shard): the gradients, the version being produced, the rules.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/backend_memory.hpp"
#include "kernels/bf16.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

class Layer;
class Model;

/// Where a stage holds a tied parameter.
enum class TiedRole : uint8_t { none, owner, copy, both };

/// Clip scales applied by one update: `stage` to every parameter of the stage, `tied` instead to
/// the copy side of a tied parameter whose owner is another stage (exchange_grads, where the
/// scale is global: the same as `stage`, so both copies get the same update).
struct UpdateScales {
  float stage = 1.0f;
  float tied = 1.0f;
};

/// How an update treats one parameter slot of a layer.
///  stage_scale  clipped by UpdateScales::stage
///  tied_scale   the copy of a tied parameter owned by another stage, kept equal by exchanging
///               gradients (exchange_grads): clipped by UpdateScales::tied
///  skip         the copy of a tied parameter that follows its owner (follow_owner): the owner's
///               stage updates it, the copy's version keeps what it holds
enum class SlotUpdate : uint8_t { stage_scale, tied_scale, skip };

/// A tied parameter of the model as one stage holds it.
struct TiedLayout {
  TiedRole role = TiedRole::none;
  int owner_stage = 0, copy_stage = 0;
  int owner_local = -1, copy_local = -1;                ///< local layer indices, when held here
  size_t owner_offset = 0, copy_offset = 0, numel = 0;  ///< floats into those layers' buffers
};

/// One update of one stage, from StageWorker::begin_update to StageWorker::commit_update. It
/// lends the holder the gradients accumulated for the update (the worker accumulates later
/// microbatches into another buffer meanwhile) and the buffers of the version being produced
/// (a copy of the newest version at begin_update, or the newest version itself when the stage
/// keeps one version). The holder runs the cross-stage steps of the update protocol on it
/// (tied-gradient exchange, finish_gradients, clip scale) and applies it
/// (OptimizerShard::run_update), possibly on another thread than the worker's: nothing in a job
/// is touched by the worker between begin_update and commit_update. One thread at a time uses a
/// job. Misuse (a step out of order) is an AP_CHECK.
class UpdateJob {
 public:
  UpdateJob() = default;
  UpdateJob(const UpdateJob&) = delete;
  UpdateJob& operator=(const UpdateJob&) = delete;

  /// Between begin_update and commit_update.
  bool open() const { return open_; }
  int stage() const { return stage_; }
  /// The optimizer step this update is (1-based), which is the id of the version it produces.
  long step() const { return step_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  /// Global index of the stage's first layer.
  int first_layer() const { return first_; }
  const Layer& layer(int i) const;

  /// Where the job's spans point (its stage's memory, StageWorker::memory()): host code reads
  /// and writes them through it (to_host, to_backend) unless it is host memory.
  BackendMemory& memory() const { return *memory_; }
  /// Local layer i's parameters in the version being produced.
  std::span<float> params(int i);
  std::span<const float> params(int i) const;
  /// Local layer i's gradients of this update.
  std::span<float> grads(int i);
  std::span<const float> grads(int i) const;
  /// Every gradient of this update, layer after layer (grads(0), grads(1), ... back to back):
  /// what a data-parallel job sums over its replicas (GradientReducer) before step 1.
  std::span<float> gradients();
  /// Local layer i's weight change since the weights this update's gradients were computed at,
  /// Δ = W_now − W_stale (W_now: the newest version, which the update starts from), for the
  /// delay corrections dc and secant (optimizer.delay_correction); empty when nothing is stale or
  /// the correction needs no Δ.
  std::span<const float> weight_change(int i) const;
  /// How the update treats each of layer i's slots (Layer::slots() order).
  std::span<const SlotUpdate> slot_updates(int i) const;
  /// Per slot of layer i (Layer::slots() order), where the update writes the bf16 rounding of
  /// the slot's new weights in its own pass (nullptr: nowhere); empty when the stage keeps no
  /// bf16 copies. The worker's copies for the products of the version produced.
  std::span<bf16* const> rounded(int i) const;

  /// Tied parameters of the model (Model::tied()) and the stage's role in each.
  size_t num_tied() const { return tied_.size(); }
  TiedRole tied_role(size_t k) const;
  /// Protocol step 1: this stage's gradient contribution to tied parameter k (its owner or copy
  /// side; not `both`).
  std::span<const float> tied_grad(size_t k) const;
  /// Protocol step 1: overwrites this stage's side of tied parameter k's gradient with the sum
  /// (host memory: copied into the job's memory through ctx's backend, the holder's).
  void set_tied_grad(Context& ctx, size_t k, std::span<const float> sum);
  /// Protocol step 2, once: reduces the tied pairs held entirely by this stage (owner + copy),
  /// then returns Σg² of each of the stage's layers (Model::grad_sumsq), in layer order.
  std::span<const double> finish_gradients(Context& ctx);
  bool finished() const { return finished_; }
  /// Once the update was applied: the owner side (owner or both) of tied parameter k in the
  /// version produced (what a follow_owner owner publishes).
  std::span<const float> tied_weights(size_t k) const;
  /// The update math ran (OptimizerShard::run_update): the version is ready to commit.
  bool applied() const { return applied_; }

 private:
  friend class StageWorker;
  friend class OptimizerShard;

  size_t tied_offset(size_t k) const;  // this stage's side of k, floats into the gradients

  // layout, fixed when the worker is built
  const Model* model_ = nullptr;
  BackendMemory* memory_ = &host_backend_memory();
  int stage_ = 0;
  int first_ = 0;
  std::vector<std::shared_ptr<const Layer>> layers_;
  std::vector<size_t> offsets_;                   // per local layer, floats into the gradients
  std::vector<std::vector<SlotUpdate>> updates_;  // per local layer, per slot
  std::vector<TiedLayout> tied_;
  std::vector<double> sumsq_;
  std::vector<std::span<float>> params_;     // per local layer, in the version being produced
  const float* change_ = nullptr;            // Δ of every layer, at offsets_; nullptr = none
  std::vector<std::vector<bf16*>> rounded_;  // per local layer, per slot; empty = none

  // the update
  float* grads_ = nullptr;
  long step_ = 0;
  bool open_ = false;
  bool finished_ = false;
  bool applied_ = false;
  bool rounded_written_ = false;  // run_update wrote rounded_
};

}  // namespace actorpipe
