// Sampler: text generation from a trained causal model (a GPT, or a model of one's own layers
// whose loss layer keeps logits for every position), greedy or by temperature and top-k, seeded;
// the weights from a checkpoint of any stage count, the whole model computed in this process, on
// the CPU or on a compute backend (a GPU), whose memory then holds the weights and activations.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "engine/model/model.hpp"
#include "engine/rng.hpp"
#include "kernels/backend_memory.hpp"
#include "kernels/context.hpp"

namespace actorpipe {

/// How tokens are drawn.
struct SampleOptions {
  int tokens = 200;          ///< tokens to generate after the prompt
  double temperature = 1.0;  ///< 0: greedy (the most likely token); else softmax(logits / t)
  int top_k = 0;             ///< draw among the k most likely tokens only; 0: all
  uint64_t seed = 1;         ///< the draws' generator (the same seed, the same text)
};

/// The next token from `logits` (one row of V): with temperature 0 the most likely one (the
/// lowest id among equals); else a draw from softmax(logits / temperature) restricted to the
/// top_k largest logits (0: all; equals ordered by id), computed in double, from one uniform of
/// `rng`. The options must be valid (check_sample_options).
int32_t pick_token(std::span<const float> logits, double temperature, int top_k, SplitMix64& rng);

/// Errors name the bad option: tokens >= 0, temperature >= 0 and finite, top_k >= 0.
Status check_sample_options(const SampleOptions& options);

class Sampler {
 public:
  /// `params[i]`: layer i's parameters (Model::layer(i).param_floats() floats). Errors: a model
  /// whose loss layer keeps no logits for every position (BERT's MLM head computes the masked
  /// ones only), or buffers of the wrong sizes. `threads`: the Context's threads. `backend`:
  /// what the layers compute on (not owned, it must outlive the sampler); null: the CPU. Off the
  /// host the weights are copied into its memory, and only each step's last logits come back.
  static Expected<std::unique_ptr<Sampler>> create(Model model,
                                                   std::vector<std::vector<float>> params,
                                                   int threads = 1,
                                                   ComputeBackend* backend = nullptr);
  /// The built-in model of `model` with the weights of `checkpoint` (a checkpoint directory, or a
  /// directory of them: its newest that loads), written by a run of any stage count. Errors: the
  /// checkpoint's model differs from `model` (naming the keys), or a tensor is missing.
  static Expected<std::unique_ptr<Sampler>> from_checkpoint(const ModelOptions& model,
                                                            const std::string& checkpoint,
                                                            ComputeBackend* backend = nullptr);

  const Model& model() const { return model_; }
  /// Where the weights came from (the checkpoint's directory), or empty.
  const std::string& source() const { return source_; }
  /// What the layers compute on: "cpu (1 threads)", "cuda:0 (NVIDIA H200)".
  const std::string& device() const { return device_; }

  /// The logits (V) of the token after `context` (non-empty; its last model.context tokens are
  /// what the model sees). Valid until the next call.
  std::span<const float> next_logits(std::span<const int32_t> context);

  /// `prompt` (non-empty, ids < vocab_size) followed by options.tokens generated tokens.
  Expected<std::vector<int32_t>> generate(std::span<const int32_t> prompt,
                                          const SampleOptions& options);

 private:
  Sampler(Model model, const std::vector<std::vector<float>>& params, int threads,
          ComputeBackend* backend);
  Model model_;
  Context ctx_;
  // in the memory the layers compute on
  std::vector<BackendBuffer> params_;
  BackendBuffer hidden_a_, hidden_b_, saved_;
  std::vector<float> logits_;  // the last position's, on the host
  std::string source_;
  std::string device_;
};

}  // namespace actorpipe
