// BackendTrainer: the ReferenceTrainer's optimizer step (m microbatches forward and backward,
// tied gradients summed, global-norm clip, update) with every buffer (parameters, gradients,
// optimizer state, activations) in one ComputeBackend's memory: a whole model trained on one
// device. On the CPU backend it computes the ReferenceTrainer's bits (fp32, the update unfused);
// on another backend the parity tests hold it to the ReferenceTrainer with tolerances.
#pragma once

#include <span>
#include <vector>

#include "engine/batch.hpp"
#include "engine/model/model.hpp"
#include "engine/options.hpp"
#include "kernels/compute_backend.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

class BackendTrainer {
 public:
  /// Parameters start at the model's seeded init (made on the host, then copied to the
  /// backend). `backend` must outlive the trainer. fp32 until set_precision.
  BackendTrainer(Model model, const OptimizerOptions& opt, int B, int T, ComputeBackend& backend);

  /// compute_gradients then apply_update; returns the step's loss (1/m)·Σⱼ meanⱼ.
  double step(std::span<const Microbatch> mbs);
  /// Zeroes the gradients, runs forward + backward of each microbatch in order (dloss =
  /// loss_scale(countⱼ, m)), then sums tied gradients (owner + copy, written to both).
  double compute_gradients(std::span<const Microbatch> mbs);
  /// Global gradient norm (Model::grad_sumsq per layer, in layer order), clip scale, then
  /// optimizer_update of every layer at step steps()+1, all on the backend.
  void apply_update();
  /// Forward only of one microbatch.
  LossStats forward(const Microbatch& mb);
  /// What the products compute in (ComputeBackend::precision): in bf16 they round their
  /// operands, every other op and the master weights, gradients and optimizer state stay f32. The
  /// layers keep their activations in f32 (a bf16 product rounds them as it reads them: the same
  /// values as the ReferenceTrainer's bf16 activations).
  void set_precision(Precision p);

  /// Host copies of layer i's buffers (wait for the backend).
  std::vector<float> params(int layer) const;
  std::vector<float> grads(int layer) const;
  /// Replaces layer i's parameters (param_floats() values).
  void set_params(int layer, std::span<const float> values);

  const Model& model() const { return model_; }
  ComputeBackend& backend() { return backend_; }
  long steps() const { return steps_; }
  double last_grad_norm() const { return last_grad_norm_; }

 private:
  struct LayerBuffers {
    BackendBuffer params, grads, state, saved;
  };
  void reset_scratch();
  void run_backward(const Microbatch& mb, float dloss);

  Model model_;
  OptimizerOptions opt_;
  int B_, T_;
  ComputeBackend& backend_;
  Context ctx_;  // its backend is backend_; its host arena holds the layers' index arrays
  std::vector<LayerBuffers> buffers_;
  std::vector<BackendBuffer> hidden_;  // hidden_[i] = output of layer i, (B,T,C)
  BackendBuffer dhidden_a_, dhidden_b_;
  long steps_ = 0;
  double last_grad_norm_ = 0.0;
};

}  // namespace actorpipe
