// MarkovChain: the sparse random Markov chain behind the synthetic corpus, with its stationary
// distribution (power iteration in double) and its exact entropy rate H = Σ_s π(s)·H(P(·|s)).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "engine/data/data_rng.hpp"
#include "engine/expected.hpp"

namespace actorpipe {

class MarkovChain {
 public:
  /// One transition of a row: (successor state, probability).
  using Edge = std::pair<int32_t, double>;

  /// A random chain over `states` states, drawn from `seed`: state s has `branching` distinct
  /// successors; the first is s's successor on a random cycle through all states (so the chain is
  /// irreducible), the others are uniform among the remaining states; the probabilities are
  /// Dirichlet(1, ..., 1) (normalised exponential draws). Errors name the bad argument.
  static Expected<MarkovChain> random(int states, int branching, uint64_t seed);

  /// A chain from explicit rows (rows[s] = transitions out of s; probabilities > 0 summing to 1
  /// within 1e-9, successors distinct and in range). The chain must be irreducible.
  static Expected<MarkovChain> from_rows(const std::vector<std::vector<Edge>>& rows);

  int states() const { return static_cast<int>(offsets_.size()) - 1; }
  /// Successors of state s and their probabilities, in the same order.
  std::span<const int32_t> successors(int s) const;
  std::span<const double> probabilities(int s) const;
  /// P(to | from); 0 when `to` is not a successor of `from`.
  double transition(int from, int to) const;

  /// The stationary distribution π (π = πP, Σπ = 1).
  const std::vector<double>& stationary() const { return pi_; }
  /// Entropy rate H = Σ_s π(s)·H(P(·|s)) in nats per token.
  double entropy_rate() const { return entropy_rate_; }
  /// Entropy of the stationary distribution H(π) in nats: that of a sequence's first token.
  double stationary_entropy() const { return stationary_entropy_; }
  /// ‖πP − π‖₁ of the computed π, and the power iterations it took.
  double stationary_residual() const { return residual_; }
  int stationary_iterations() const { return iterations_; }

  /// A draw from π.
  int32_t sample_initial(DataRng& rng) const;
  /// A draw from P(· | s).
  int32_t sample_next(int32_t s, DataRng& rng) const;
  /// A stationary path: out[0] ~ π, out[t+1] ~ P(· | out[t]).
  void sample(std::span<int32_t> out, DataRng& rng) const;

 private:
  MarkovChain() = default;
  static Expected<MarkovChain> build(std::vector<int64_t> offsets, std::vector<int32_t> succ,
                                     std::vector<double> prob);
  static int32_t pick(std::span<const double> cumulative, double u);

  std::vector<int64_t> offsets_;  // (S+1) CSR row starts
  std::vector<int32_t> succ_;     // (E) successor states
  std::vector<double> prob_;      // (E) probabilities
  std::vector<double> cum_;       // (E) cumulative probabilities within each row
  std::vector<double> pi_;        // (S) stationary distribution
  std::vector<double> pi_cum_;    // (S) cumulative π
  double entropy_rate_ = 0;
  double stationary_entropy_ = 0;
  double residual_ = 0;
  int iterations_ = 0;
};

}  // namespace actorpipe
