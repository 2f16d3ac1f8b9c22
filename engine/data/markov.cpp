// MarkovChain: random sparse chain construction, stationary distribution by lazy power
// iteration, entropy rate, and sampling by inverse CDF.
#include "engine/data/markov.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/check.hpp"

namespace actorpipe {
namespace {

constexpr int64_t kMaxEdges = int64_t{1} << 24;  // states × branching
constexpr int kMaxIterations = 100000;
constexpr double kTolerance = 1e-14;  // ‖π_{k+1} − π_k‖₁ of the lazy iteration

// States reachable from state 0 along the edges (forward) or against them (reverse).
std::vector<char> reachable_from_zero(const std::vector<int64_t>& offsets,
                                      const std::vector<int32_t>& succ, bool reverse) {
  const int S = static_cast<int>(offsets.size()) - 1;
  std::vector<std::vector<int32_t>> adj(S);
  for (int s = 0; s < S; ++s) {
    for (int64_t e = offsets[s]; e < offsets[s + 1]; ++e) {
      if (reverse) {
        adj[succ[e]].push_back(s);
      } else {
        adj[s].push_back(succ[e]);
      }
    }
  }
  std::vector<char> seen(S, 0);
  std::vector<int32_t> stack{0};
  seen[0] = 1;
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (int32_t t : adj[s]) {
      if (!seen[t]) {
        seen[t] = 1;
        stack.push_back(t);
      }
    }
  }
  return seen;
}

// Uniform draw in the open interval (0, 1).
double open_uniform(DataRng& rng) {
  return (static_cast<double>(rng.next_u64() >> 11) + 0.5) * 0x1.0p-53;
}

}  // namespace

Expected<MarkovChain> MarkovChain::random(int states, int branching, uint64_t seed) {
  if (states < 1) {
    return make_error("synthetic chain: {} states; at least 1 is needed", states);
  }
  if (branching < 1 || branching > states) {
    return make_error("data.synthetic_branching = {}: must be in [1, {}] (the number of states)",
                      branching, states);
  }
  if (int64_t{states} * branching > kMaxEdges) {
    return make_error(
        "data.synthetic_branching = {}: {} states × {} successors = {} transitions exceeds the "
        "limit of {}",
        branching, states, branching, int64_t{states} * branching, kMaxEdges);
  }
  DataRng rng(seed);
  // A random cycle through all states makes the chain irreducible.
  std::vector<int32_t> perm(states);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = states - 1; i > 0; --i) {
    std::swap(perm[i], perm[rng.below(static_cast<uint64_t>(i) + 1)]);
  }
  std::vector<int32_t> cycle_next(states);
  for (int i = 0; i < states; ++i) cycle_next[perm[i]] = perm[(i + 1) % states];

  std::vector<int64_t> offsets(states + 1);
  std::vector<int32_t> succ(static_cast<size_t>(states) * branching);
  std::vector<double> prob(succ.size());
  std::vector<int32_t> stamp(states, -1);  // stamp[t] == s: t already a successor of s
  std::vector<int32_t> pool;               // dense rows: partial Fisher–Yates over all states
  const bool dense = 2 * branching > states;
  for (int s = 0; s < states; ++s) {
    const int64_t base = int64_t{s} * branching;
    offsets[s] = base;
    succ[base] = cycle_next[s];
    stamp[cycle_next[s]] = s;
    if (dense) {
      pool.clear();
      for (int t = 0; t < states; ++t) {
        if (t != cycle_next[s]) pool.push_back(t);
      }
      for (int k = 1; k < branching; ++k) {
        const size_t j = (k - 1) + rng.below(pool.size() - (k - 1));
        std::swap(pool[k - 1], pool[j]);
        succ[base + k] = pool[k - 1];
      }
    } else {
      for (int k = 1; k < branching; ++k) {
        int32_t t;
        do {
          t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(states)));
        } while (stamp[t] == s);
        stamp[t] = s;
        succ[base + k] = t;
      }
    }
    double total = 0;
    for (int k = 0; k < branching; ++k) {
      prob[base + k] = -std::log(open_uniform(rng));
      total += prob[base + k];
    }
    for (int k = 0; k < branching; ++k) prob[base + k] /= total;
  }
  offsets[states] = int64_t{states} * branching;
  return build(std::move(offsets), std::move(succ), std::move(prob));
}

Expected<MarkovChain> MarkovChain::from_rows(const std::vector<std::vector<Edge>>& rows) {
  const int S = static_cast<int>(rows.size());
  if (S < 1) return make_error("Markov chain: no states; at least 1 is needed");
  std::vector<int64_t> offsets(S + 1, 0);
  std::vector<int32_t> succ;
  std::vector<double> prob;
  std::vector<int32_t> stamp(S, -1);
  for (int s = 0; s < S; ++s) {
    offsets[s] = static_cast<int64_t>(succ.size());
    if (rows[s].empty()) return make_error("Markov chain: row {} has no successor", s);
    double total = 0;
    for (const auto& [t, p] : rows[s]) {
      if (t < 0 || t >= S) {
        return make_error("Markov chain: row {}: successor {} is out of range [0, {})", s, t, S);
      }
      if (stamp[t] == s) {
        return make_error("Markov chain: row {}: successor {} is listed twice", s, t);
      }
      if (!(p > 0) || !(p <= 1)) {
        return make_error("Markov chain: row {}: probability {} of successor {} is not in (0, 1]",
                          s, p, t);
      }
      stamp[t] = s;
      total += p;
      succ.push_back(t);
      prob.push_back(p);
    }
    if (std::abs(total - 1.0) > 1e-9) {
      return make_error("Markov chain: row {}: probabilities sum to {}, not 1", s, total);
    }
  }
  offsets[S] = static_cast<int64_t>(succ.size());
  return build(std::move(offsets), std::move(succ), std::move(prob));
}

Expected<MarkovChain> MarkovChain::build(std::vector<int64_t> offsets, std::vector<int32_t> succ,
                                         std::vector<double> prob) {
  const int S = static_cast<int>(offsets.size()) - 1;
  for (bool reverse : {false, true}) {
    const std::vector<char> seen = reachable_from_zero(offsets, succ, reverse);
    for (int t = 0; t < S; ++t) {
      if (!seen[t]) {
        return make_error(
            "Markov chain is not irreducible: state {} {} state 0; every state must reach every "
            "other",
            t, reverse ? "cannot reach" : "is not reachable from");
      }
    }
  }
  MarkovChain c;
  c.offsets_ = std::move(offsets);
  c.succ_ = std::move(succ);
  c.prob_ = std::move(prob);
  c.cum_.resize(c.prob_.size());
  for (int s = 0; s < S; ++s) {
    double acc = 0;
    for (int64_t e = c.offsets_[s]; e < c.offsets_[s + 1]; ++e) {
      acc += c.prob_[e];
      c.cum_[e] = acc;
    }
  }

  // Lazy power iteration π ← ½(π + πP): same fixed point as πP, and it converges for every
  // irreducible chain, periodic ones included.
  std::vector<double> pi(S, 1.0 / S);
  std::vector<double> next(S);
  double diff = 0;
  int it = 0;
  for (; it < kMaxIterations; ++it) {
    std::fill(next.begin(), next.end(), 0.0);
    for (int s = 0; s < S; ++s) {
      for (int64_t e = c.offsets_[s]; e < c.offsets_[s + 1]; ++e) {
        next[c.succ_[e]] += pi[s] * c.prob_[e];
      }
    }
    double total = 0;
    for (int s = 0; s < S; ++s) {
      next[s] = 0.5 * (pi[s] + next[s]);
      total += next[s];
    }
    diff = 0;
    for (int s = 0; s < S; ++s) {
      next[s] /= total;
      diff += std::abs(next[s] - pi[s]);
    }
    pi.swap(next);
    if (diff < kTolerance) break;
  }
  if (diff >= kTolerance) {
    return make_error(
        "Markov chain: stationary distribution did not converge in {} iterations (last change "
        "{:.3g})",
        kMaxIterations, diff);
  }
  c.iterations_ = it + 1;
  c.pi_ = std::move(pi);

  // Residual ‖πP − π‖₁, entropy rate and stationary entropy.
  std::fill(next.begin(), next.end(), 0.0);
  double H = 0;
  for (int s = 0; s < S; ++s) {
    double row_entropy = 0;
    for (int64_t e = c.offsets_[s]; e < c.offsets_[s + 1]; ++e) {
      next[c.succ_[e]] += c.pi_[s] * c.prob_[e];
      row_entropy -= c.prob_[e] * std::log(c.prob_[e]);
    }
    H += c.pi_[s] * row_entropy;
  }
  double residual = 0, H0 = 0;
  c.pi_cum_.resize(S);
  double acc = 0;
  for (int s = 0; s < S; ++s) {
    residual += std::abs(next[s] - c.pi_[s]);
    if (c.pi_[s] > 0) H0 -= c.pi_[s] * std::log(c.pi_[s]);
    acc += c.pi_[s];
    c.pi_cum_[s] = acc;
  }
  c.entropy_rate_ = H;
  c.stationary_entropy_ = H0;
  c.residual_ = residual;
  return c;
}

std::span<const int32_t> MarkovChain::successors(int s) const {
  AP_CHECK(s >= 0 && s < states(), "state {} of {}", s, states());
  return {succ_.data() + offsets_[s], static_cast<size_t>(offsets_[s + 1] - offsets_[s])};
}

std::span<const double> MarkovChain::probabilities(int s) const {
  AP_CHECK(s >= 0 && s < states(), "state {} of {}", s, states());
  return {prob_.data() + offsets_[s], static_cast<size_t>(offsets_[s + 1] - offsets_[s])};
}

double MarkovChain::transition(int from, int to) const {
  const auto succ = successors(from);
  for (size_t k = 0; k < succ.size(); ++k) {
    if (succ[k] == to) return prob_[offsets_[from] + static_cast<int64_t>(k)];
  }
  return 0.0;
}

int32_t MarkovChain::pick(std::span<const double> cumulative, double u) {
  const auto it = std::upper_bound(cumulative.begin(), cumulative.end(), u);
  // Rounding can leave the last cumulative value just below 1: u beyond it takes the last entry.
  const auto k = it == cumulative.end() ? cumulative.size() - 1 : it - cumulative.begin();
  return static_cast<int32_t>(k);
}

int32_t MarkovChain::sample_initial(DataRng& rng) const {
  return pick(pi_cum_, rng.uniform());
}

int32_t MarkovChain::sample_next(int32_t s, DataRng& rng) const {
  const int64_t b = offsets_[s];
  const std::span<const double> row{cum_.data() + b, static_cast<size_t>(offsets_[s + 1] - b)};
  return succ_[b + pick(row, rng.uniform())];
}

void MarkovChain::sample(std::span<int32_t> out, DataRng& rng) const {
  if (out.empty()) return;
  out[0] = sample_initial(rng);
  for (size_t t = 1; t < out.size(); ++t) out[t] = sample_next(out[t - 1], rng);
}

}  // namespace actorpipe
