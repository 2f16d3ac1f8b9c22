// Tests of the balanced partition (moved from bench/): brute force over every composition, a
// profile-like shape, and the errors naming the bad value.
#include "engine/planner/balanced_partition.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>

using namespace actorpipe;

namespace {

// Every composition of n layers into d stages of >= 1 layer each.
void compositions(int n, int d, std::vector<int>& cur, std::vector<std::vector<int>>& out) {
  if (d == 1) {
    cur.push_back(n);
    out.push_back(cur);
    cur.pop_back();
    return;
  }
  for (int first = 1; first <= n - (d - 1); ++first) {
    cur.push_back(first);
    compositions(n - first, d - 1, cur, out);
    cur.pop_back();
  }
}

double largest_stage(const std::vector<double>& cost, const std::vector<int>& counts) {
  double worst = 0.0;
  size_t i = 0;
  for (int c : counts) {
    double s = 0.0;
    for (int k = 0; k < c; ++k) s += cost[i++];
    worst = std::max(worst, s);
  }
  return worst;
}

}  // namespace

TEST_CASE("balanced_partition equals brute force: the smallest largest stage, last stages short") {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> cost_of(0, 9);
  for (int n = 1; n <= 8; ++n) {
    for (int d = 1; d <= std::min(n, 4); ++d) {
      for (int trial = 0; trial < 5; ++trial) {
        std::vector<double> cost;  // integers: every sum is exact
        for (int i = 0; i < n; ++i) cost.push_back(cost_of(rng));
        std::vector<std::vector<int>> all;
        std::vector<int> cur;
        compositions(n, d, cur, all);
        double best = 1e300;
        for (const auto& c : all) best = std::min(best, largest_stage(cost, c));
        // among the optimal ones: the shortest last stage, then the shortest one before it, ...
        std::vector<int> expected;
        for (const auto& c : all) {
          if (largest_stage(cost, c) != best) continue;
          if (expected.empty() || std::lexicographical_compare(c.rbegin(), c.rend(),
                                                               expected.rbegin(), expected.rend()))
            expected = c;
        }
        auto got = balanced_partition(cost, d);
        REQUIRE(got.ok());
        CHECK_MESSAGE(*got == expected, "n = ", n, ", d = ", d);
      }
    }
  }
}

TEST_CASE("balanced_partition of a profile-like shape: embedding, 6 blocks, a heavy head") {
  // embedding, 6 equal blocks, a head of 1.8 blocks
  const std::vector<double> cost = {0.1, 1, 1, 1, 1, 1, 1, 1.8};
  auto p = balanced_partition(cost, 2);
  REQUIRE(p.ok());
  CHECK(*p == std::vector<int>{5, 3});  // 4.1 | 3.8; [4, 4] would be 3.1 | 4.8
}

TEST_CASE("balanced_partition errors") {
  const std::vector<double> cost = {1, 2, 3};
  CHECK(balanced_partition(cost, 0).error().message.find("0 stages for 3 layers") !=
        std::string::npos);
  CHECK(balanced_partition(cost, 4).error().message.find("expected 1 .. 3") != std::string::npos);
  const std::vector<double> bad = {1, -2, 3};
  CHECK(balanced_partition(bad, 2).error().message.find("layer 1 costs -2") != std::string::npos);
}
