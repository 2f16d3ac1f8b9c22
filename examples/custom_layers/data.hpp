// custom_layers: the example's own data, through actorpipe's DataSource interface: sequences of
// a noisy affine successor process over the vocabulary, microbatch n a pure function of n.
#pragma once

#include <actorpipe/engine/data/data_source.hpp>
#include <cstdint>

namespace custom {

/// x₀ uniform; then x_{t+1} = (a·x_t + c) mod V with probability 1 − ε, else a uniform draw.
/// GPT-style targets: the next token. Every row of microbatch n is drawn from its own seeded
/// generator derive_seed(seed, n, row), so microbatch n is the same whenever it is asked.
class AffineSuccessorData final : public actorpipe::DataSource {
 public:
  AffineSuccessorData(int B, int T, int vocab_size, uint64_t seed, double noise = 0.2);

  actorpipe::Microbatch microbatch(uint64_t n) const override;
  int vocab_size() const override { return V_; }
  int batch_size() const override { return B_; }
  int seq_len() const override { return T_; }
  /// The entropy of the next token given the current one: every target has it.
  std::optional<double> loss_floor() const override;
  std::string describe() const override;

 private:
  int B_, T_, V_;
  uint64_t seed_;
  double noise_;
};

}  // namespace custom
