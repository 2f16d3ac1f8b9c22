// Sampler: text generation from a trained causal model (a GPT, or a model of one's own layers
// whose loss layer keeps logits for every position), greedy or by temperature and top-k, seeded;
// the weights from a checkpoint of any stage count, the whole model computed in this process.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "engine/model/model.hpp"
#include "engine/rng.hpp"
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
  /// ones only), or buffers of the wrong sizes. `threads`: the Context's threads.
  static Expected<std::unique_ptr<Sampler>> create(Model model,
                                                   std::vector<std::vector<float>> params,
                                                   int threads = 1);
  /// The built-in model of `model` with the weights of `checkpoint` (a checkpoint directory, or a
  /// directory of them: its newest that loads), written by a run of any stage count. Errors: the
  /// checkpoint's model differs from `model` (naming the keys), or a tensor is missing.
  static Expected<std::unique_ptr<Sampler>> from_checkpoint(const ModelOptions& model,
                                                            const std::string& checkpoint);

  const Model& model() const { return model_; }
  /// Where the weights came from (the checkpoint's directory), or empty.
  const std::string& source() const { return source_; }

  /// The logits (V) of the token after `context` (non-empty; its last model.context tokens are
  /// what the model sees). Valid until the next call.
  std::span<const float> next_logits(std::span<const int32_t> context);

  /// `prompt` (non-empty, ids < vocab_size) followed by options.tokens generated tokens.
  Expected<std::vector<int32_t>> generate(std::span<const int32_t> prompt,
                                          const SampleOptions& options);

 private:
  Sampler(Model model, std::vector<std::vector<float>> params, int threads);
  Model model_;
  std::vector<std::vector<float>> params_;
  Context ctx_;
  std::vector<float> hidden_a_, hidden_b_, saved_;
  std::string source_;
};

}  // namespace actorpipe
