// StageWorker: the compute unit of one pipeline stage (its layers' weight versions, gradients,
// activation stash and Context) with one exec_* call per action kind and the update hand-off.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/batch.hpp"
#include "engine/execution/activation_stash.hpp"
#include "engine/execution/scratch_pool.hpp"
#include "engine/execution/tied_params.hpp"
#include "engine/execution/update_job.hpp"
#include "engine/execution/weight_store.hpp"
#include "engine/execution/xpipe_prediction.hpp"
#include "engine/expected.hpp"
#include "engine/model/deferred_grads.hpp"
#include "engine/model/layer.hpp"
#include "engine/model/model.hpp"
#include "engine/model/partition.hpp"
#include "engine/options.hpp"
#include "engine/schedule/schedule.hpp"
#include "kernels/bf16_weights.hpp"
#include "kernels/context.hpp"
#include "kernels/tensor.hpp"
#include "kernels/tensor_pool.hpp"

namespace actorpipe {

class OptimizerShard;

/// Where gradient clipping takes its norm: one global norm per step over all stages (gpipe,
/// 1f1b, exactly as the reference trainer) or one norm per stage (2bw, pipedream, xpipe; the
/// tied parameter belongs to its owner's stage).
bool clips_globally(Mode mode);

/// What exec_forward produces.
struct ForwardOutput {
  Tensor out;      ///< (B,T,C) hidden output for the next stage; undefined at the last stage
  LossStats loss;  ///< last stage: the microbatch's loss; {0, 0} elsewhere
};

/// One F or B as executed: the weight version it computed with (as the store resolved it).
struct VersionUse {
  int stage = 0;
  ActionKind kind = ActionKind::F;
  int64_t microbatch = 0;  ///< global microbatch index (run offset + schedule index)
  int version = 0;         ///< absolute version id: updates of this stage it sees
  int lookahead = 0;       ///< xpipe F: updates predicted ahead
  int tied_version = -1;   ///< follow_owner copy stage: the tied parameter's version; else -1
  int tied_lookahead = 0;  ///< ... and the updates the owner predicted ahead of it (xpipe)
};

struct StageWorkerOptions {
  Mode mode = Mode::onef1b;
  int stage = 0;
  int microbatches = 1;  ///< m per optimizer step (pipedream updates after every microbatch)
  /// pipeline.replicas w: `microbatches` is this replica's share of a step, whose gradients are
  /// summed over the w replicas before the update; a backward scales its loss by
  /// 1/(microbatches·w) (as the one pipeline running all w·microbatches would).
  int replicas = 1;
  int B = 1;                              ///< sequences per microbatch
  int T = 1;                              ///< tokens per sequence
  int threads = 1;                        ///< the stage Context's thread budget
  Precision precision = Precision::fp32;  ///< what the stage's matrix products compute in
  /// bf16: the linear layers take a bf16 copy of each weight version made once (kept until the
  /// version's buffer changes, kernels/bf16_weights.hpp: half the stored versions' bytes more);
  /// false: a copy per product (the oracle of the tests).
  bool bf16_weight_copies = true;
  /// bf16: the layers keep the activations only their products read in bf16
  /// (Context::bf16_activations: smaller stash slots, no second rounding in the backward);
  /// false keeps them in f32 (the oracle of the tests). The same bits either way.
  bool bf16_activations = true;
  /// pipeline.stash_precision = "bf16" (needs precision bf16 and bf16_weight_copies): the
  /// versions the stage keeps besides the newest (2bw's older one, pipedream's stashed ones)
  /// hold their linear layers' weights (ParamSlot::product_operand, not tied) in bf16 only
  /// (WeightStore's bf16 stash); the same bits, less memory. Not with a dc or secant
  /// optimizer.delay_correction, whose Δ reads the stale version in f32.
  bool bf16_stash = false;
  /// Activation stash slots; 0 = the mode's bound (peak_stash of its schedule at this stage).
  int stash_slots = 0;
  /// pipeline.recompute, one flag per global layer of the model (empty = none): a recomputed
  /// layer stashes only its input; its backward runs its forward again into scratch first.
  std::vector<bool> recompute;
  bool log_versions = false;  ///< keep a VersionUse per F/B (tests, traces)
  /// Parameters start at the model's seeded initialisation; false leaves them zero, for a
  /// caller that loads every layer right away (a migration's new stage: no wasted init).
  bool init_params = true;
  /// The backend the stage computes on (not owned: it must outlive the worker and its optimizer
  /// shard). Its memory holds every buffer of the stage: weight versions, gradients, the
  /// activation stash, scratch (and the shard's state: OptimizerShard's memory). nullptr: the
  /// CPU backend of the stage's own Context, every buffer in host memory. Off the host
  /// (ComputeBackend::host_memory false) the stage copies its edges through host memory: the
  /// input and output tensors of its forwards and backwards stay host tensors, and the spans it
  /// hands out (params, grads, tied_weights, the UpdateJob's) point into the backend's memory
  /// (memory()). There it refuses, at construction, what needs the host yet
  /// (check_stage_backend); bf16 products are the backend's own (its precision: it rounds
  /// each product's operands), with neither weight copies nor bf16 activations.
  ComputeBackend* backend = nullptr;
};

/// Whether a stage of `options` can compute on options.backend: an error naming the stage, the
/// backend and what needs the host when that backend's memory is not host memory and the stage
/// would use a bf16 weight stash; fine otherwise.
Status check_stage_backend(const StageWorkerOptions& options);

/// One stage: global layers [partition.begin(r), partition.end(r)) of the model. Owns every
/// buffer it computes with (weight versions, gradients, activation stash, output tensors, its
/// Context and arena) and shares nothing mutable with other stages: d workers may run on d
/// threads. The optimizer state is not the worker's: it lives in the stage's OptimizerShard,
/// which applies the updates the worker hands out. One thread at a time calls a worker. Nothing
/// allocates in the steady state (output tensors come from pools that grow only while more are
/// in flight than ever).
///
/// Per run: start_run(), then the stage's actions in order: exec_forward / exec_backward per
/// F / B, and per OPT_STEP the update protocol:
///   0. begin_update(action) hands out the UpdateJob: the gradients accumulated for it and the
///      buffers of the version it produces (a copy of the newest one).
///   1. cross-stage tied pairs: sum = owner job's tied_grad() + copy job's tied_grad()
///      (element-wise, in that order); exchange_grads: set_tied_grad(sum) at both; follow_owner:
///      at the owner only.
///   2. job.finish_gradients() → Σg² per layer (double, layer order, tied copy excluded).
///   3. scales: clips_globally: one clip_scale over Σ of every stage's values taken in stage and
///      layer order, starting at 0.0; otherwise each stage's own sum (its layers in order): the
///      modes that clip per stage all follow the tied owner, whose scale alone covers the tied
///      parameter.
///   4. OptimizerShard::run_update(ctx, job, scales) writes the new version.
///   5. commit_update(job): the new version becomes the newest, version updates().
///   6. follow_owner: the owner's new tied weights (job.tied_weights() after step 4, or
///      tied_weights() after step 5) become TiedVersion{updates(), 0} for the copy's stage, which
///      install_tied_weights() before any forward whose tied_version_needed() asks for it; at
///      the end of the run the copy's stage installs the owner's newest version. In xpipe an
///      owner's forward that predicted also publishes the tied value it computed with
///      (predicted_tied(), right after that exec_forward).
/// Steps 1-4 touch the job and the shard only, never the worker: they may run on another thread
/// while the worker executes the stage's next actions. An action for which waits_for_update()
/// is true must wait for the commit: a forward or backward whose weight version is the one
/// being produced (or is updated in place: single, predicted and one-buffer ring policies), and
/// the next OPT_STEP. When the policy keeps several versions, backwards in the meantime
/// accumulate into a second gradient buffer. So in 2bw the stage computes the next step's
/// microbatches on the current version while its shard writes the next (shadow) one. An
/// executor that runs steps 0-5 back to back computes the same bits.
/// Misuse (a version not stored, a microbatch not stashed, a step out of order) is an AP_CHECK.
class StageWorker {
 public:
  /// Buffers whose contents are dead at rest (scratch: the activation stash, the backward
  /// ping-pong, the recompute scratch) come from `scratch_pool` where it has them (a layer move
  /// hands the retired stages' buffers to the new ones), else they are allocated.
  StageWorker(const Model& model, const Partition& partition, const OptimizerOptions& optimizer,
              const StageWorkerOptions& options, ScratchPool* scratch_pool = nullptr);
  ~StageWorker();
  StageWorker(const StageWorker&) = delete;
  StageWorker& operator=(const StageWorker&) = delete;

  int stage() const { return stage_; }
  int stages() const { return partition_.stages(); }
  Mode mode() const { return opts_.mode; }
  const Model& model() const { return model_; }
  const Partition& partition() const { return partition_; }
  /// Global index of the stage's first layer; the stage holds num_layers() layers.
  int first_layer() const { return first_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  bool is_first() const { return stage_ == 0; }
  bool is_last() const { return stage_ == stages() - 1; }
  /// Microbatches averaged by one update: m, or 1 for pipedream.
  int microbatches_per_update() const { return update_mbs_; }

  /// Prepares a run of `schedule` (validated by the caller; its microbatch j is the global
  /// microbatch microbatch_offset + j). Version ids restart from the current weights: the
  /// schedule's version v means updates() + v. Older versions are forgotten, except in a
  /// continued 2bw schedule (Schedule::continued), whose version -1 is the stored version
  /// updates() - 1 (holds_previous()). Errors: the schedule is of another mode, stage count or
  /// microbatches per step, or needs more stash slots than this worker has; a microbatch is still
  /// in flight; a continued schedule without the previous version.
  Status start_run(const Schedule& schedule, int64_t microbatch_offset);
  /// The run started by start_run(whole) ends after fewer steps: `shorter` is
  /// first_steps(whole, k), and the stage has run only actions of those k steps. The actions
  /// still to come are `shorter`'s from where the stage stands. Errors: no run, a schedule of
  /// another mode or shape, or one that is not shorter.
  Status shorten_run(const Schedule& shorter);

  /// F: forward of the stage's layers. `in` is the previous stage's output (B,T,C), undefined
  /// at stage 0. The output tensor's storage is the worker's until every holder drops it: pass it
  /// on without copying.
  ForwardOutput exec_forward(const Action& action, const Microbatch& mb, const Tensor& in);
  /// Held-out evaluation: a forward of the stage's layers with its newest weights (the ones a
  /// run would start from), between runs only (nothing in flight), keeping nothing: no stash,
  /// no version binding, no gradient, nothing a later run or update would see. `in` as for
  /// exec_forward; the output is a fresh tensor. The same layer calls as exec_forward, so an
  /// evaluation's loss is the bits of a training forward at those weights.
  ForwardOutput evaluate(const Microbatch& mb, const Tensor& in);
  /// B: backward of the stage's layers with the microbatch's stashed activations and version,
  /// accumulating the gradients. `dout` is the next stage's result (B,T,C), undefined at the
  /// last stage. Returns the gradient w.r.t. the stage's input (undefined at stage 0).
  Tensor exec_backward(const Action& action, const Microbatch& mb, const Tensor& dout);
  /// B in two halves, for a stage whose input gradient someone waits for: the first half
  /// computes and returns the gradient w.r.t. the stage's input and records the weight
  /// gradients of the stage's linear maps (DeferredGrads); exec_backward_weights() computes
  /// them and ends the B. Nothing else may run on the worker in between (AP_CHECK). Together
  /// they compute the bits of exec_backward; the input gradient is ready a weight pass earlier
  /// and costs a stage-sized copy of those maps' output gradients meanwhile.
  Tensor exec_backward_input(const Action& action, const Microbatch& mb, const Tensor& dout);
  void exec_backward_weights();
  /// Between exec_backward_input and exec_backward_weights.
  bool backward_pending() const { return pending_ != nullptr; }
  /// Called on the worker's thread as soon as a layer's gradients of an update are complete: in
  /// the update's last backward (its microbatches_per_update()-th since the previous
  /// begin_update), right after the layer's weight gradients are accumulated (in a split
  /// backward: as exec_backward_weights passes the layer), layers last to first, layers without
  /// parameters left out. `step` is the update (updates() + 1 when it is begun) and `grads` the
  /// layer's part of the buffer that update's job will hold: the worker does not touch it again
  /// before that update is committed, so someone may sum it over the replicas meanwhile
  /// (pipeline.replicas). Empty: none.
  using FinalGradients = std::function<void(int local_layer, long step, std::span<float> grads)>;
  /// Only for a stage in host memory (the spans are read on the host): AP_CHECK otherwise.
  void on_final_gradients(FinalGradients fn);
  /// OPT_STEP, protocol step 0: opens the update producing version updates() + 1 and hands
  /// out its job (the worker's own object, valid until commit_update). Fails (AP_CHECK) while
  /// another update is open, when the action produces another version, or when the policy
  /// updates its only version in place and a microbatch is bound to it.
  UpdateJob& begin_update(const Action& action);
  /// Protocol step 5: the job (applied by OptimizerShard::run_update) becomes the newest version.
  void commit_update(UpdateJob& job);
  /// An update is open (between begin_update and commit_update).
  bool update_open() const { return job_.open(); }
  /// The open update's job, which the stage's optimizer shard applies (AP_CHECK: one is open).
  UpdateJob& open_update();
  /// True while `action` (the stage's next one) must wait for the open update's commit: a
  /// forward whose version is not stored yet, a forward or backward of a policy that updates in
  /// place (or without a second gradient buffer), another OPT_STEP. False when no update is open.
  bool waits_for_update(const Action& action) const;
  /// xpipe: the shard whose optimizer moments (the state after the newest committed update)
  /// predict the forwards' weights. Read only inside exec_forward, which never runs while an
  /// update is open (the predicted policy updates in place). Other modes never read it.
  void predict_from(const OptimizerShard& shard);
  /// FLUSH: checks that no microbatch is in flight.
  void exec_flush(const Action& action);

  /// Tied parameters of the model (Model::tied()) and this stage's role in each.
  size_t num_tied() const;
  TiedRole tied_role(size_t k) const;
  /// Owner side: tied parameter k in the newest version (version updates()).
  std::span<const float> tied_weights(size_t k) const;
  /// follow_owner copy stage: the tied value forward `f` needs when the weights it will use do
  /// not hold it yet; an invalid TiedVersion otherwise (nothing to install).
  TiedVersion tied_version_needed(const Action& f, size_t k) const;
  /// Installs value `version` of tied parameter k into the weights forward `f` will use.
  void install_tied_weights(const Action& f, size_t k, TiedVersion version,
                            std::span<const float> w);
  /// Owner side of tied parameter k in xpipe (follow_owner): when the last exec_forward computed
  /// with a prediction (lookahead > 0 past version 0), that predicted value and its TiedVersion,
  /// which the copy's stage needs for the same microbatch; otherwise an invalid version and no
  /// weights (in memory(): host_view reads them). Valid until the next exec_forward.
  struct PredictedTied {
    TiedVersion version;
    std::span<const float> weights;
  };
  PredictedTied predicted_tied(size_t k) const;
  /// follow_owner copy stage at the end of a run (nothing in flight): installs the owner's newest
  /// version (`version` == updates()) into the newest weights, so both copies are equal at rest.
  /// A run starts only from equal copies. In 2bw also the owner's version updates() - 1 into the
  /// stored previous version (holds_previous()), which a continued run computes with.
  void install_tied_weights(size_t k, int version, std::span<const float> w);
  /// follow_owner copy stage: which owner value stored version `version` holds for tied
  /// parameter k (an invalid TiedVersion when none was installed there).
  TiedVersion tied_held(int version, size_t k) const;
  /// Owner side: tied parameter k in stored version `version`.
  std::span<const float> tied_weights(size_t k, int version) const;

  /// Updates committed so far (the optimizer's step counter, the newest version id).
  long updates() const { return updates_; }
  /// Floats the stage keeps for optimizer.delay_correction besides the optimizer state: dc's and
  /// secant's weight change Δ (one float per parameter in 2bw and pipedream), else 0.
  size_t delay_correction_floats() const { return weight_change_.size(); }
  /// Sets the update counter of idle weights (a resume): the newest version is renamed to it.
  void set_updates(long updates);
  /// 2bw: the stage stores version updates() - 1 beside the newest one (after a run, or a resume
  /// that restored it), so the next run can continue exactly (make_2bw with `continued`).
  bool holds_previous() const;
  /// 2bw, idle, updates() >= 1: version updates() - 1 of local layer i, writable (a resume
  /// restores it after set_updates(); the version becomes stored).
  std::span<float> mutable_previous_params(int i);
  /// Parameters of local layer i in stored version `version` (with a bf16 stash, a stashed
  /// version's linear weights read as zeros here: WeightStore::stashed_bf16 holds them).
  std::span<const float> params(int version, int i) const { return store_->params(version, i); }
  const WeightStore& store() const { return *store_; }
  /// Bytes the stage's weights hold now, measured: the version store's resident pages and bf16
  /// stash (WeightStore::resident_bytes) and the bf16 copies its products read.
  size_t weight_bytes() const { return store_->resident_bytes() + bf16_weights_.bytes(); }
  /// Newest parameters of local layer i (global layer first_layer() + i).
  std::span<const float> params(int i) const;
  /// Newest parameters, writable while no microbatch is in flight (initialisation, loading).
  std::span<float> mutable_params(int i);
  /// Gradients accumulated so far for the next update (not the open update's: its job has them).
  std::span<const float> grads(int i) const;
  int stash_slots() const;
  /// Local layer i is recomputed (StageWorkerOptions::recompute).
  bool recomputes(int i) const;
  /// Bytes allocated for the activation stash (every slot; ActivationStash::bytes()).
  size_t stash_bytes() const { return stash_.bytes(); }
  /// Bytes allocated once for recompute: the recomputed layers' saved activations of one
  /// microbatch (all of them, so a split backward's deferred weight half can read them) and
  /// one (B,T,C) output; 0 without recompute.
  size_t recompute_scratch_bytes() const;
  /// Microbatches whose F ran and B has not.
  int in_flight() const;
  const std::vector<VersionUse>& version_log() const { return log_; }
  /// What the worker was built with (a migration builds a stage's new worker from them).
  const StageWorkerOptions& options() const { return opts_; }
  const OptimizerOptions& optimizer_options() const { return opt_; }
  /// Takes `partition` as the pipeline's layout when this stage keeps exactly its layers in it
  /// (a migration between other stages); AP_CHECK otherwise.
  void repartition(const Partition& partition);
  /// Idle (nothing in flight, no update open): hands the scratch buffers (the activation stash,
  /// the backward ping-pong, the recompute scratch, the evaluation buffers) to `pool`. Weights,
  /// gradients and every other state stay. Until take_scratch() the stage runs nothing:
  /// start_run() and evaluate() refuse.
  void give_scratch(ScratchPool& pool);
  /// The scratch buffers sized again (zeroed) from `pool` where it has them: the stage computes
  /// exactly as before give_scratch().
  void take_scratch(ScratchPool& pool);
  /// The scratch buffers are in place (not given away).
  bool holds_scratch() const { return stash_.has_buffers(); }
  Context& context() { return ctx_; }
  /// Where the stage's buffers live (StageWorkerOptions::backend's memory, else host memory):
  /// every span the worker and its UpdateJob hand out points into it.
  BackendMemory& memory() const { return *memory_; }
  /// A stage in host memory allocates the tensors it sends forward (its outputs) in `forward`
  /// and those it sends back (its input gradients) in `backward`: the send_memory() of the
  /// channels they go on, so that posting them copies nothing. nullptr: host memory. Each must
  /// outlive the tensors in it (a lasting memory). Applies to the tensors acquired afterwards
  /// (a pool whose memory changes starts afresh; tensors out keep theirs). Ignored off the
  /// host, where those tensors stay in the device's lasting memory.
  void set_edge_memory(BackendMemory* forward, BackendMemory* backward);

 private:
  using Slot = ActivationStash::Slot;
  /// out_pool_ and din_pool_, allocating in `forward` and `backward` (nullptr: host memory).
  void make_edge_pools(BackendMemory* forward, BackendMemory* backward);

  // B up to the input gradient (weight gradients into `later` when not null); the slot is
  // pending until finish_backward().
  Tensor backward_layers(const Action& a, const Microbatch& mb, const Tensor& dout,
                         DeferredGrads* later);
  void finish_backward();
  // local layer i's gradients are complete: tells final_grads_ when this B is its update's last
  void layer_gradients_final(int i);
  // where local layer i's saved activations live for `slot`'s microbatch
  float* saved_of(Slot& slot, int i);
  void check_action(const Action& a, ActionKind kind) const;
  // the scratch buffers but the stash's (give_scratch), from `pool` where it has them
  void take_scratch_buffers(ScratchPool* pool);
  // begin_update: the bf16 arrays the update fills with its product operands' new rounding
  void reserve_rounded();
  // the bf16 copies of the weights written since their last sync (per version buffer and
  // layer) are forgotten; the others' stay (a version's copies outlive the other buffers'
  // updates, and an installed tied value costs only its layer's)
  void sync_bf16_copies();
  // before each layer call: the host arena's and the backend's scratch are free again
  void reset_scratch();
  // the edges: off the host, an incoming tensor's floats (on the host or a device's) copied into
  // the stage's memory (`staging`), and an outgoing tensor (in the stage's lasting memory, or a
  // host tensor) written from `staging` once the stage's ops finished; on the host, the
  // tensor's own floats (a host copy of a device's, in host_in_)
  const float* stage_in(const Tensor& t, BackendBuffer& staging);
  float* stage_out(Tensor& t, BackendBuffer& staging);
  void finish_out(Tensor& t, const BackendBuffer& staging);

  // where every buffer of the stage lives (weight versions, gradients, the activation stash,
  // the backward ping-pong, the recompute and evaluation buffers): the process's host memory,
  // which outlives any pool the scratch buffers go to
  BackendMemory* memory_ = &host_backend_memory();
  Model model_;
  Partition partition_;
  OptimizerOptions opt_;
  StageWorkerOptions opts_;
  FinalGradients final_grads_;
  int backwards_since_update_ = 0;  // finished backwards into the current gradient buffer
  bool final_backward_ = false;     // the B in progress is its update's last
  int stage_ = 0;
  int first_ = 0;
  int update_mbs_ = 1;
  std::vector<std::shared_ptr<const Layer>> layers_;
  Context ctx_;
  Bf16Weights bf16_weights_;               // the weight versions' bf16 copies (bf16_weight_copies)
  std::vector<const float*> rounded_src_;  // the open update's weights whose copies it writes

  std::unique_ptr<WeightStore> store_;
  // gradients: the buffer backwards accumulate into, and a second one while the policy keeps
  // several versions (backwards may run while an update holds the first)
  BackendBuffer grad_buf_[2];
  float* grads_ = nullptr;
  BackendBuffer predicted_;
  // xpipe with basis rotation: per local layer, the rotated slots' directions of the latest
  // state, computed by the step's first predicting forward and read by the others
  std::vector<RotatedDirections> directions_;
  std::vector<size_t> param_off_;  // per local layer
  // per local layer: its saved activations' offset in a stash slot's `saved` (not recomputed)
  // or in recompute_saved_ (recomputed); xpipe: a recomputed layer's weights in a slot's
  // `weights`
  std::vector<size_t> saved_off_, weight_off_;
  std::vector<bool> recompute_;    // per local layer
  size_t recompute_floats_ = 0;    // recompute_saved_'s size
  BackendBuffer recompute_saved_;  // the recomputed layers' saved activations (scratch)
  BackendBuffer recompute_out_;    // (B,T,C): a recomputed forward's output, unused
  TiedParams tied_;
  UpdateJob job_;                            // the update handed out (layout fixed at build)
  const OptimizerShard* moments_ = nullptr;  // xpipe prediction
  BackendBuffer weight_change_;              // dc: Δ of the open update (empty: not needed)
  int last_backward_version_ = -1;           // the version the last backward used

  ActivationStash stash_;
  size_t bth_ = 0;             // B·T·width: one (B,T,C) tensor
  BackendBuffer dh_a_, dh_b_;  // backward ping-pong (B,T,C)
  // off the host: the (B,T,C) edges in the stage's memory (a forward's output and a backward's
  // input gradient; a backward's output gradient); empty on the host
  BackendBuffer edge_out_, edge_in_;
  // evaluate(): hidden states between layers (B,T,C) x 2 and one layer's saved activations,
  // allocated at the first evaluation
  BackendBuffer eval_hidden_, eval_saved_;
  DeferredGrads later_;      // the weight half of a B split by exec_backward_input
  Slot* pending_ = nullptr;  // the B whose weight half is pending
  Action pending_action_;
  std::unique_ptr<TensorPool> out_pool_, din_pool_;
  Tensor host_in_;  // stage_in on the host: the copy of a tensor from a device

  long updates_ = 0;
  int base_ = 0;              // absolute version of the run's version 0
  int64_t mb_offset_ = 0;     // global index of the run's microbatch 0
  int run_microbatches_ = 0;  // total microbatches of the current run
  bool run_active_ = false;
  TiedVersion predicted_tied_;  // owner: the tied value the last forward predicted, if it did
  std::vector<VersionUse> log_;
};

}  // namespace actorpipe
