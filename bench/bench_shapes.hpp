// Benchmark shapes: the named GPT configurations the benchmark trains (tiny, small, gpt2)
// and the model-FLOP count of one training step, the numerator of every GFLOP/s figure.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "engine/model/model.hpp"
#include "engine/options.hpp"

namespace actorpipe::bench {

/// One benchmarked configuration: a GPT model and its microbatch (B sequences of T tokens).
/// A step is one microbatch: forward, backward and one optimizer update.
struct BenchShape {
  std::string name;
  ModelOptions model;
  int B = 0;
  int T = 0;
  /// "V256 T128 d128 L4 H4 B8".
  std::string describe() const;
  long tokens_per_step() const { return static_cast<long>(B) * T; }
};

/// tiny, small and gpt2 (GPT-2 small, 124M parameters: context 1024, trained at T=64).
const std::vector<BenchShape>& bench_shapes();

/// The shape called `name`; the error lists the known names.
Expected<BenchShape> find_bench_shape(const std::string& name);

/// The value of the option args[i] (--shape) as the name of a known shape; i moves onto it. The
/// error names the option and lists the known names.
Expected<std::string> shape_option(std::span<const std::string> args, size_t& i);

/// Parameters whose use in a step is a matrix product: every trainable parameter (the tied
/// embedding counted once, as the LM head's weight) except the position table (maxT·C),
/// which is only looked up. Biases and layernorm gains are included (a 0.1% effect).
long matmul_parameters(const Model& model);

/// Model FLOPs of one step (the PaLM appendix-B count):
///   6·N·(B·T) + 12·L·T·C·(B·T),  N = matmul_parameters(model).
/// 6·N per token is forward (2N) plus backward (4N); 12·L·T·C per token is the attention
/// score and value products (QKᵀ and A·V: 2·2·T·C per layer forward, twice that backward),
/// counted over the full T×T square although a causal kernel may skip the upper triangle.
/// The optimizer, layernorm, GELU, softmax and cross-entropy are not counted.
double step_model_flops(const Model& model, int B, int T);

}  // namespace actorpipe::bench
