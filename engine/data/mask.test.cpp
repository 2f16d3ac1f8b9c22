// BERT masking tests: exact selection count, uniform positions, 80/10/10 replacement shares
// within statistical bounds on a large sample, targets, and reproducibility.
#include "engine/data/mask.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

using namespace actorpipe;

TEST_CASE("selected count: max(1, round(p*T)), at most T") {
  CHECK(bert_selected_count(128, 0.15) == 19);  // 19.2
  CHECK(bert_selected_count(10, 0.15) == 2);    // 1.5 rounds away from zero
  CHECK(bert_selected_count(3, 0.15) == 1);     // 0.45 → at least one
  CHECK(bert_selected_count(1, 0.15) == 1);
  CHECK(bert_selected_count(7, 1.0) == 7);
  CHECK(bert_selected_count(512, 0.15) == 77);  // 76.8
}

TEST_CASE("80/10/10 of the selected positions, uniform positions, targets") {
  const int T = 128, V = 1000, seqs = 20000;
  const BertMasking m{0.15, V, V};  // [MASK] = V, random replacements in [0, V)
  const int k = bert_selected_count(T, m.mask_prob);
  std::vector<int32_t> original(T), tokens(T), targets(T);
  for (int t = 0; t < T; ++t) original[t] = (t * 37 + 11) % V;
  std::vector<double> per_position(T, 0.0);
  double masked = 0, random = 0, kept = 0, random_sum = 0;
  for (int i = 0; i < seqs; ++i) {
    tokens = original;
    DataRng rng = DataRng::derive(5, 2, static_cast<uint64_t>(i), 0);
    apply_bert_mask(tokens, targets, m, rng);
    int selected = 0;
    for (int t = 0; t < T; ++t) {
      if (targets[t] == -1) {
        REQUIRE(tokens[t] == original[t]);  // unselected positions are untouched
        continue;
      }
      ++selected;
      per_position[t] += 1;
      REQUIRE(targets[t] == original[t]);
      if (tokens[t] == V) {
        masked += 1;
      } else if (tokens[t] == original[t]) {
        kept += 1;  // includes random draws that hit the original (probability 1/V of 10%)
      } else {
        REQUIRE(tokens[t] >= 0);
        REQUIRE(tokens[t] < V);
        random += 1;
        random_sum += tokens[t];
      }
    }
    REQUIRE(selected == k);
  }
  const double n = static_cast<double>(seqs) * k;
  auto within = [n](double count, double p) {
    const double sd = std::sqrt(p * (1 - p) / n);
    return std::abs(count / n - p) < 5 * sd;
  };
  MESSAGE("masked " << masked / n << ", random " << random / n << ", kept " << kept / n);
  CHECK(within(masked, 0.8));
  CHECK(within(random, 0.1 * (1 - 1.0 / V)));
  CHECK(within(kept, 0.1 + 0.1 / V));
  // Random replacements are uniform on [0, V): their mean is (V−1)/2 (sd of a uniform: V/√12).
  const double mean = random_sum / random;
  CHECK(std::abs(mean - (V - 1) / 2.0) < 5 * V / std::sqrt(12.0 * random));
  // Every position is selected with probability k/T.
  const double p = static_cast<double>(k) / T;
  for (int t = 0; t < T; ++t) {
    CHECK(std::abs(per_position[t] / seqs - p) < 5 * std::sqrt(p * (1 - p) / seqs));
  }
}

TEST_CASE("masking is reproducible from the generator and differs between seeds") {
  const BertMasking m{0.15, 99, 99};
  std::vector<int32_t> a(64), b(64), c(64), ta(64), tb(64), tc(64);
  for (int t = 0; t < 64; ++t) a[t] = b[t] = c[t] = t;
  DataRng r1(7), r2(7), r3(8);
  apply_bert_mask(a, ta, m, r1);
  apply_bert_mask(b, tb, m, r2);
  apply_bert_mask(c, tc, m, r3);
  CHECK(a == b);
  CHECK(ta == tb);
  CHECK(ta != tc);
}

TEST_CASE("mask_prob 1 selects every position") {
  const BertMasking m{1.0, 50, 50};
  std::vector<int32_t> tokens(20, 3), targets(20);
  DataRng rng(1);
  apply_bert_mask(tokens, targets, m, rng);
  for (int32_t t : targets) CHECK(t == 3);
}
