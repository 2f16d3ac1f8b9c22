// Layer profile: each layer of a model timed alone for one microbatch (forward, backward, the
// optimizer's share of an update, a weight-version copy, an XPipe prediction) at a thread count.
#pragma once

#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "engine/options.hpp"

namespace actorpipe::bench {

/// Median seconds of one layer's work for one microbatch of (B, T).
struct LayerCost {
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

struct LayerProfile {
  int threads = 1;
  int B = 0;
  int T = 0;
  int reps = 0;
  int load_threads = 0;           ///< other threads computing meanwhile (profile_layers_loaded)
  bool tied = false;              ///< the model ties the token embedding and the LM head
  std::vector<LayerCost> layers;  ///< one per global layer, in order
};

/// Builds the model at its seeded initialisation and a Context of `threads` threads (the rule a
/// stage of threads_per_stage threads follows), runs one forward and one backward chain over all
/// layers with random tokens to warm up and to get realistic inputs, then times every layer's
/// forward, backward, the weight half of a split backward, update (with `optimizer`), copy and
/// prediction `reps` times each; medians.
/// Errors: a bad model, B, T or reps.
Expected<LayerProfile> profile_layers(const ModelOptions& model, const OptimizerOptions& optimizer,
                                      int B, int T, int threads, int reps);

/// profile_layers with `load_threads` other threads busy meanwhile, each running the same
/// profile on a Context of 1 thread (its own model and buffers) in a loop until this one is
/// done: the per-layer costs a stage sees while the other stages of a pipeline compute on the
/// other cores (shared caches, memory bandwidth, the host's scheduling of the vCPUs).
/// LayerProfile::load_threads records the load. Errors: as profile_layers, or load_threads < 0.
Expected<LayerProfile> profile_layers_loaded(const ModelOptions& model,
                                             const OptimizerOptions& optimizer, int B, int T,
                                             int threads, int reps, int load_threads);

}  // namespace actorpipe::bench
