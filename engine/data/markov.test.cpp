// MarkovChain tests: stationary distribution and entropy rate against closed forms on tiny
// chains, against brute-force estimates from long sampled paths, and structure/error checks.
#include "engine/data/markov.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <vector>

using namespace actorpipe;

namespace {

// Binary entropy in nats.
double h2(double p) {
  return -p * std::log(p) - (1 - p) * std::log(1 - p);
}

MarkovChain must(Expected<MarkovChain> c) {
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? "" : c.error().message));
  return std::move(*c);
}

std::string error_of(const Expected<MarkovChain>& c) {
  REQUIRE_FALSE(c.ok());
  return c.error().message;
}

}  // namespace

TEST_CASE("two-state chain: stationary distribution and entropy rate in closed form") {
  // P = [[1−a, a], [b, 1−b]]: π = (b, a)/(a+b), H = π0·h(a) + π1·h(b), H(π) = h(π0).
  const double a = 0.1, b = 0.3;
  const MarkovChain c = must(MarkovChain::from_rows({{{0, 1 - a}, {1, a}}, {{0, b}, {1, 1 - b}}}));
  CHECK(c.states() == 2);
  CHECK(c.stationary()[0] == doctest::Approx(0.75).epsilon(1e-12));
  CHECK(c.stationary()[1] == doctest::Approx(0.25).epsilon(1e-12));
  CHECK(c.entropy_rate() == doctest::Approx(0.75 * h2(a) + 0.25 * h2(b)).epsilon(1e-12));
  CHECK(c.stationary_entropy() == doctest::Approx(h2(0.25)).epsilon(1e-12));
  CHECK(c.stationary_residual() < 1e-12);
  CHECK(c.transition(0, 1) == a);
  CHECK(c.transition(1, 1) == 1 - b);
}

TEST_CASE("periodic doubly stochastic chain: uniform stationary distribution (lazy iteration)") {
  // Bipartite {0,1} <-> {2,3}, period 2; every column sums to 1, so π is uniform.
  const MarkovChain c = must(MarkovChain::from_rows(
      {{{2, 0.3}, {3, 0.7}}, {{2, 0.7}, {3, 0.3}}, {{0, 0.6}, {1, 0.4}}, {{0, 0.4}, {1, 0.6}}}));
  for (double p : c.stationary()) CHECK(p == doctest::Approx(0.25).epsilon(1e-12));
  CHECK(c.entropy_rate() == doctest::Approx(0.5 * (h2(0.3) + h2(0.4))).epsilon(1e-12));
  CHECK(c.stationary_entropy() == doctest::Approx(std::log(4.0)).epsilon(1e-12));
}

TEST_CASE("deterministic cycle: zero entropy rate, branching 1 random chain is one cycle") {
  const MarkovChain c = must(MarkovChain::from_rows({{{1, 1.0}}, {{2, 1.0}}, {{0, 1.0}}}));
  CHECK(c.entropy_rate() == 0.0);
  CHECK(c.stationary_entropy() == doctest::Approx(std::log(3.0)).epsilon(1e-12));

  const MarkovChain r = must(MarkovChain::random(17, 1, 5));
  CHECK(r.entropy_rate() == 0.0);
  // Following the single successor from 0 visits all 17 states before returning.
  std::set<int> seen;
  int s = 0;
  for (int i = 0; i < 17; ++i) {
    seen.insert(s);
    s = r.successors(s)[0];
  }
  CHECK(s == 0);
  CHECK(seen.size() == 17);
}

TEST_CASE("random chain: structure, determinism by seed, irreducibility") {
  const int S = 40, k = 5;
  const MarkovChain c = must(MarkovChain::random(S, k, 11));
  const MarkovChain same = must(MarkovChain::random(S, k, 11));
  const MarkovChain other = must(MarkovChain::random(S, k, 12));
  bool differs = false;
  for (int s = 0; s < S; ++s) {
    const auto succ = c.successors(s);
    const auto prob = c.probabilities(s);
    REQUIRE(succ.size() == static_cast<size_t>(k));
    CHECK(std::set<int32_t>(succ.begin(), succ.end()).size() == static_cast<size_t>(k));
    double total = 0;
    for (size_t i = 0; i < succ.size(); ++i) {
      CHECK(succ[i] >= 0);
      CHECK(succ[i] < S);
      CHECK(prob[i] > 0);
      total += prob[i];
      CHECK(same.successors(s)[i] == succ[i]);
      CHECK(same.probabilities(s)[i] == prob[i]);
      differs =
          differs || other.successors(s)[i] != succ[i] || other.probabilities(s)[i] != prob[i];
    }
    CHECK(total == doctest::Approx(1.0).epsilon(1e-12));
  }
  CHECK(differs);
  CHECK(c.entropy_rate() == same.entropy_rate());
  CHECK(c.entropy_rate() > 0);
  CHECK(c.entropy_rate() < std::log(static_cast<double>(k)));
  CHECK(std::accumulate(c.stationary().begin(), c.stationary().end(), 0.0) ==
        doctest::Approx(1.0).epsilon(1e-12));
  CHECK(c.stationary_residual() < 1e-12);

  // Dense rows (branching > states/2) take the other construction path.
  const MarkovChain dense = must(MarkovChain::random(9, 8, 3));
  for (int s = 0; s < 9; ++s) {
    const auto succ = dense.successors(s);
    CHECK(std::set<int32_t>(succ.begin(), succ.end()).size() == 8);
  }
  const MarkovChain full = must(MarkovChain::random(6, 6, 3));
  for (int s = 0; s < 6; ++s) CHECK(full.successors(s).size() == 6);
}

TEST_CASE("entropy rate equals brute-force estimates from a long sampled path") {
  const MarkovChain c = must(MarkovChain::random(50, 4, 7));
  const int N = 2'000'000;
  std::vector<int32_t> x(N);
  DataRng rng(99);
  c.sample(x, rng);

  // (a) mean −log P(x[t+1] | x[t]) along the path: checks π (the path visits states ~ π).
  double nll = 0;
  for (int t = 0; t + 1 < N; ++t) nll -= std::log(c.transition(x[t], x[t + 1]));
  nll /= N - 1;
  // (b) plug-in estimate from bigram counts only: independent of the chain's numbers.
  std::vector<double> unigram(c.states(), 0.0);
  std::map<std::pair<int, int>, double> bigram;
  for (int t = 0; t + 1 < N; ++t) {
    unigram[x[t]] += 1;
    bigram[{x[t], x[t + 1]}] += 1;
  }
  double plug_in = 0;
  for (const auto& [st, n] : bigram) plug_in -= n / (N - 1) * std::log(n / unigram[st.first]);
  // The stationary frequencies themselves.
  double max_freq_err = 0;
  for (int s = 0; s < c.states(); ++s) {
    max_freq_err = std::max(max_freq_err, std::abs(unigram[s] / (N - 1) - c.stationary()[s]));
  }
  // Mean row entropy (what H would be with a wrong, uniform π): the tolerance must separate it.
  double uniform_pi_H = 0;
  for (int s = 0; s < c.states(); ++s) {
    for (double p : c.probabilities(s)) uniform_pi_H -= p * std::log(p) / c.states();
  }
  const double H = c.entropy_rate();
  const double tol = 3e-3;  // ≈ 6 standard errors of a 2e6-step mean
  MESSAGE("H = " << H << ", path nll = " << nll << ", plug-in = " << plug_in
                 << ", H with uniform pi = " << uniform_pi_H);
  CHECK(std::abs(nll - H) < tol);
  CHECK(std::abs(plug_in - H) < tol);
  CHECK(std::abs(uniform_pi_H - H) > 3 * tol);
  CHECK(max_freq_err < 2e-3);
  // Nothing outside the chain's transitions was ever sampled.
  for (const auto& [st, n] : bigram) CHECK(c.transition(st.first, st.second) > 0);
}

TEST_CASE("first token of a sampled path follows the stationary distribution") {
  const MarkovChain c = must(MarkovChain::random(8, 3, 21));
  std::vector<double> count(8, 0.0);
  const int n = 200'000;
  for (int i = 0; i < n; ++i) {
    DataRng rng = DataRng::derive(1, 2, static_cast<uint64_t>(i), 0);
    count[c.sample_initial(rng)] += 1;
  }
  for (int s = 0; s < 8; ++s) {
    const double p = c.stationary()[s];
    CHECK(std::abs(count[s] / n - p) < 5 * std::sqrt(p * (1 - p) / n));
  }
}

TEST_CASE("a large vocabulary converges quickly") {
  const MarkovChain c = must(MarkovChain::random(50257, 4, 42));
  CHECK(c.stationary_residual() < 1e-12);
  CHECK(c.entropy_rate() > 0);
  MESSAGE("iterations: " << c.stationary_iterations() << ", H = " << c.entropy_rate());
}

TEST_CASE("bad chains are errors naming the problem") {
  CHECK(error_of(MarkovChain::random(10, 0, 1)).find("synthetic_branching = 0") !=
        std::string::npos);
  CHECK(error_of(MarkovChain::random(10, 11, 1)).find("[1, 10]") != std::string::npos);
  CHECK(error_of(MarkovChain::random(0, 1, 1)).find("0 states") != std::string::npos);
  CHECK(error_of(MarkovChain::random(50000, 50000, 1)).find("exceeds") != std::string::npos);
  CHECK(error_of(MarkovChain::from_rows({})).find("no states") != std::string::npos);
  CHECK(error_of(MarkovChain::from_rows({{{0, 0.5}, {1, 0.4}}, {{0, 1.0}}}))
            .find("row 0: probabilities sum to 0.9") != std::string::npos);
  CHECK(error_of(MarkovChain::from_rows({{{0, 0.5}, {0, 0.5}}}))
            .find("successor 0 is listed twice") != std::string::npos);
  CHECK(error_of(MarkovChain::from_rows({{{1, 1.0}}, {{2, 1.0}}}))
            .find("row 1: successor 2 is out of range") != std::string::npos);
  CHECK(error_of(MarkovChain::from_rows({{{1, 1.0}}, {}})).find("row 1 has no successor") !=
        std::string::npos);
  CHECK(error_of(MarkovChain::from_rows({{{0, 1.0}, {1, 0.0}}, {{0, 1.0}}}))
            .find("probability 0 of successor 1") != std::string::npos);
  // 0 → 1 → 1: state 1 never returns to 0.
  CHECK(error_of(MarkovChain::from_rows({{{1, 1.0}}, {{1, 1.0}}})).find("not irreducible") !=
        std::string::npos);
  // 0 → 0, 1 → 0: state 1 is not reachable from 0.
  CHECK(error_of(MarkovChain::from_rows({{{0, 1.0}}, {{0, 1.0}}}))
            .find("state 1 is not reachable from state 0") != std::string::npos);
}
