// ReferenceTrainer: the single-process, single-Context numerical oracle of one optimizer step
// (gradient accumulation over m microbatches, tied-gradient sum, global-norm clip, update).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "engine/batch.hpp"
#include "engine/execution/layer_optimizer.hpp"
#include "engine/model/layer.hpp"
#include "engine/model/model.hpp"
#include "engine/options.hpp"
#include "kernels/aligned_vector.hpp"
#include "kernels/bf16_weights.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

/// Holds every layer's parameter, gradient and optimizer-state buffer plus the activations
/// of one microbatch of fixed shape (B, T); all allocated up front, so a steady-state step
/// allocates nothing. Parameters start at the model's seeded init.
class ReferenceTrainer {
 public:
  ReferenceTrainer(Model model, const OptimizerOptions& opt, int B, int T, int threads = 1);

  /// One optimizer step over `mbs` (m = mbs.size() microbatches of shape (B, T)):
  /// compute_gradients then apply_update. Returns the step's loss (1/m)·Σⱼ meanⱼ.
  double step(std::span<const Microbatch> mbs);

  /// Zeroes the gradients (unless apply_update's pass left them zero and nobody asked for
  /// them since), runs forward + backward of each microbatch in order (dloss =
  /// loss_scale(countⱼ, m)) accumulating into the gradient buffers, then sums tied gradients
  /// (owner + copy, written to both). Returns the step's loss; parameters are unchanged.
  double compute_gradients(std::span<const Microbatch> mbs);

  /// Global gradient norm (Model::grad_sumsq per layer, summed in layer order; tied
  /// parameter once), clip scale, then optimizer_update of every layer at step steps()+1. With
  /// the fused update (the default) the update's pass also zeroes the gradients and, in bf16,
  /// writes the new weights' bf16 copies for the products (optimizer_update_slots): the same
  /// bits as separate passes.
  void apply_update();
  /// Off: the update, a fill of the gradients at the next compute_gradients and the products'
  /// own conversions of the weights run as separate passes, as before they were fused (a
  /// benchmark's comparison; the bits are the same).
  void set_fused_update(bool on) { fused_update_ = on; }
  /// The bf16 copies of the weights (bf16 precision): copies_made() counts the conversions the
  /// products made themselves.
  const Bf16Weights& bf16_weights() const { return bf16_weights_; }

  /// Forward only of one microbatch; its activations (and logits()) stay until the next call.
  LossStats forward(const Microbatch& mb);
  /// Logits of the last microbatch run forward: one row of V per entry of the loss layer's
  /// logit_rows() (every position for GPT, the masked ones for BERT).
  const float* logits() const;

  /// What the matrix products compute in (fp32 by default). In bf16 the linear layers take a
  /// bf16 copy of each weight made once per update (kernels/bf16_weights.hpp), as a stage does,
  /// and the layers' saved activations take the layout of context().bf16_activations() (set
  /// that first).
  void set_precision(Precision p);

  const Model& model() const { return model_; }
  const OptimizerOptions& optimizer_options() const { return opt_; }
  Context& context() { return ctx_; }
  int num_layers() const { return model_.num_layers(); }
  /// Writable: the weights' bf16 copies are made again after any call.
  std::span<float> params(int layer) {
    ++weights_generation_;
    return buffers_.at(static_cast<size_t>(layer)).params;
  }
  /// Writable: the next compute_gradients zeroes them again.
  std::span<float> grads(int layer) {
    grads_zero_ = false;
    return buffers_.at(static_cast<size_t>(layer)).grads;
  }
  /// AdamW: m then v (2·param_floats); SGD: momentum (param_floats).
  std::span<float> optimizer_state(int layer) {
    return buffers_.at(static_cast<size_t>(layer)).state;
  }
  /// Optimizer steps applied so far (the AdamW step counter); settable for a resume.
  long steps() const { return steps_; }
  void set_steps(long steps) { steps_ = steps; }
  /// Global gradient norm (before clipping) of the last apply_update.
  double last_grad_norm() const { return last_grad_norm_; }

 private:
  struct LayerBuffers {
    // on cache lines, as the products read and write them (kernels/aligned_vector.hpp)
    AlignedVector<float> storage;  // params | grads | state
    std::span<float> params, grads, state;
    AlignedVector<float> saved;  // activations of the current microbatch
  };
  void run_backward(const Microbatch& mb, float dloss);

  Model model_;
  OptimizerOptions opt_;
  int B_, T_;
  Context ctx_;
  std::vector<LayerBuffers> buffers_;
  std::vector<AlignedVector<float>> hidden_;  // hidden_[i] = output of layer i, (B,T,C)
  AlignedVector<float> dhidden_a_, dhidden_b_;
  long steps_ = 0;
  double last_grad_norm_ = 0.0;
  Bf16Weights bf16_weights_;
  uint64_t weights_generation_ = 0;  // changes whenever the weights may have been written
  bool fused_update_ = true;
  bool grads_zero_ = true;                 // every gradient is 0 (apply_update cleared them)
  std::vector<SlotRule> rules_;            // apply_update's, per slot of one layer
  std::vector<const float*> rounded_src_;  // the weights whose bf16 copies the update wrote
};

}  // namespace actorpipe
