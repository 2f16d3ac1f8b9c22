// Profiler: each layer of a model measured alone for one microbatch (forward, backward, the weight
// half of a split backward, update, copy, prediction) on a stage's thread budget; the planner's
// LayerCosts from those times and the byte counts the model implies.
#pragma once

#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "engine/model/model.hpp"
#include "engine/options.hpp"
#include "engine/planner/layer_costs.hpp"
#include "kernels/precision.hpp"

namespace actorpipe {

/// Median seconds of one layer's work for one microbatch of (B, T).
struct LayerTiming {
  std::string name;       ///< "gpt_embedding 0", "gpt_block 3", "gpt_head 7"
  double forward = 0.0;   ///< Layer::forward
  double backward = 0.0;  ///< Layer::backward (accumulating into the gradient)
  /// The weight half of a split backward (DeferredGrads::run after Layer::backward recorded
  /// it): what a stage computes after handing its input gradient on. 0 for the embedding.
  double backward_weight = 0.0;
  double update = 0.0;   ///< Σg² + the optimizer update + zeroing the gradient
  double copy = 0.0;     ///< copying the parameters (a new weight version: 2bw, pipedream)
  double predict = 0.0;  ///< predict_weights one update ahead (an xpipe forward with s > 0)
};

/// A measured profile: one LayerTiming per global layer and what it was measured with.
struct LayerProfile {
  int threads = 1;
  int B = 0;
  int T = 0;
  int reps = 0;
  int load_threads = 0;             ///< other threads computing meanwhile (profile_layers_loaded)
  bool tied = false;                ///< the model ties the token embedding and the LM head
  std::vector<LayerTiming> layers;  ///< one per global layer, in order
};

/// Builds the model at its seeded initialisation and a Context of `threads` threads (the rule a
/// stage of pipeline.threads_per_stage threads follows), runs one forward and one backward chain
/// over all layers with random tokens (BERT: segments 0 and every seventh position masked) to
/// warm up and to get realistic inputs, then times every layer's forward, backward, the weight
/// half of a split backward, update (with `optimizer`), copy and prediction `reps` times each;
/// medians. The products compute in `precision` (pipeline.precision), the weights rounded per
/// product (a stage keeps them once per version: its forward and backward are a little faster
/// in bf16 than profiled). Errors: a bad model, B, T or reps ("layer profile: B = 0, ...").
Expected<LayerProfile> profile_layers(const ModelOptions& model, const OptimizerOptions& optimizer,
                                      int B, int T, int threads, int reps,
                                      Precision precision = Precision::fp32);
/// The same for a model already built (a model of one's own layers, Model::from_layers).
Expected<LayerProfile> profile_layers(const Model& model, const OptimizerOptions& optimizer, int B,
                                      int T, int threads, int reps,
                                      Precision precision = Precision::fp32);

/// profile_layers with `load_threads` other threads busy meanwhile, each running forward and
/// backward chains of the same model on a Context of 1 thread (its own model and buffers) until
/// this one is done: the per-layer costs a stage sees while the other stages of a pipeline
/// compute on the other cores. LayerProfile::load_threads records the load. Errors: as
/// profile_layers, or load_threads < 0.
Expected<LayerProfile> profile_layers_loaded(const ModelOptions& model,
                                             const OptimizerOptions& optimizer, int B, int T,
                                             int threads, int reps, int load_threads,
                                             Precision precision = Precision::fp32);

/// The bytes of every layer for microbatches of (B, T), from the model's own sizes (times 0):
///  - parameter, gradient, version: Layer::param_floats() floats each (a tied copy counts at
///    both layers: each holds its own buffer);
///  - optimizer: optimizer_state_floats (AdamW m and v: 2 per parameter; SGD momentum: 1);
///  - activation: what the stage's activation stash keeps per microbatch for the layer, its
///    saved activations (Layer::saved_floats, in bf16 saved_floats_bf16: a stage's Context keeps
///    bf16 activations) plus its (B, T, C) input (the embedding's input
///    is the microbatch's token ids, which every stage holds anyway: not counted);
///  - recompute_activation: the input alone;
///  - output: the (B, T, C) hidden state it hands on (0 for the head: it ends in the loss);
///  - weight copy: in bf16 (`precision`) Layer::param_floats() bf16 values, the copy of one
///    stored version the products read (StageWorkerOptions::bf16_weight_copies); 0 in fp32.
///  - version with `bf16_stash` (pipeline.stash_precision = "bf16"): a stored extra version
///    keeps its product operands (ParamSlot::product_operand) in bf16 only, the values its
///    weight copy counts, so its version bytes are the other floats alone.
/// All else f32 (4 bytes a float). Errors: a bad model, B < 1 or T outside [1, context].
Expected<std::vector<LayerCosts>> layer_bytes(const ModelOptions& model,
                                              const OptimizerOptions& optimizer, int B, int T,
                                              Precision precision = Precision::fp32,
                                              bool bf16_stash = false);
/// The same for a model already built.
Expected<std::vector<LayerCosts>> layer_bytes(const Model& model, const OptimizerOptions& optimizer,
                                              int B, int T, Precision precision = Precision::fp32,
                                              bool bf16_stash = false);

/// The planner's costs: layer_bytes for the profile's (B, T), `precision` and `bf16_stash` with
/// the profile's times (forward, backward, backward_weight, update). Errors: as layer_bytes, or
/// a profile with another number of layers than the model.
Expected<std::vector<LayerCosts>> layer_costs(const LayerProfile& profile,
                                              const ModelOptions& model,
                                              const OptimizerOptions& optimizer,
                                              Precision precision = Precision::fp32,
                                              bool bf16_stash = false);
/// The same for a model already built.
Expected<std::vector<LayerCosts>> layer_costs(const LayerProfile& profile, const Model& model,
                                              const OptimizerOptions& optimizer,
                                              Precision precision = Precision::fp32,
                                              bool bf16_stash = false);

}  // namespace actorpipe
