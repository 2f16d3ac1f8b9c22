// Balanced partition: best[s][j], the smallest largest stage over the first j layers in s
// stages, then a walk back from the end taking each stage as short as the optimum allows.
#include "engine/planner/balanced_partition.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace actorpipe {

Expected<std::vector<int>> balanced_partition(std::span<const double> cost, int stages) {
  const int n = static_cast<int>(cost.size());
  if (stages < 1 || stages > n)
    return make_error("balanced partition: {} stages for {} layers, expected 1 .. {}", stages, n,
                      n);
  for (size_t i = 0; i < cost.size(); ++i) {
    if (!std::isfinite(cost[i]) || cost[i] < 0)
      return make_error("balanced partition: layer {} costs {}, expected a finite value >= 0", i,
                        cost[i]);
  }
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int i = 0; i < n; ++i)
    prefix[static_cast<size_t>(i) + 1] =
        prefix[static_cast<size_t>(i)] + cost[static_cast<size_t>(i)];
  auto span_cost = [&](int i, int j) {
    return prefix[static_cast<size_t>(j)] - prefix[static_cast<size_t>(i)];
  };
  constexpr double inf = std::numeric_limits<double>::infinity();
  // best[s][j]: the smallest largest stage over the first j layers cut into s stages
  std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1,
                                        std::vector<double>(static_cast<size_t>(n) + 1, inf));
  best[0][0] = 0.0;
  for (int s = 1; s <= stages; ++s) {
    for (int j = s; j <= n; ++j) {
      double b = inf;
      for (int i = s - 1; i < j; ++i)
        b = std::min(
            b, std::max(best[static_cast<size_t>(s) - 1][static_cast<size_t>(i)], span_cost(i, j)));
      best[static_cast<size_t>(s)][static_cast<size_t>(j)] = b;
    }
  }
  // walk back from the end, each stage as short as the optimum allows (more layers early)
  const double target = best[static_cast<size_t>(stages)][static_cast<size_t>(n)];
  std::vector<int> counts(static_cast<size_t>(stages));
  int j = n;
  for (int s = stages; s >= 1; --s) {
    int cut = s - 1;
    for (int i = j - 1; i >= s - 1; --i) {
      if (span_cost(i, j) <= target &&
          best[static_cast<size_t>(s) - 1][static_cast<size_t>(i)] <= target) {
        cut = i;
        break;
      }
    }
    counts[static_cast<size_t>(s) - 1] = j - cut;
    j = cut;
  }
  return counts;
}

}  // namespace actorpipe
