// Tests of the variant rows' order: every variant once a round, the order turned round every
// other round.
#include "bench/variant_rows.hpp"

#include <doctest/doctest.h>

#include <algorithm>

using namespace actorpipe::bench;

namespace {
using Order = std::vector<size_t>;
}

TEST_CASE("variant order: forward in even rounds, backward in odd ones") {
  CHECK(variant_order(0, 3) == Order{0, 1, 2});
  CHECK(variant_order(1, 3) == Order{2, 1, 0});
  CHECK(variant_order(2, 3) == Order{0, 1, 2});
  CHECK(variant_order(5, 2) == Order{1, 0});
  CHECK(variant_order(1, 1) == Order{0});
  CHECK(variant_order(1, 0).empty());
}

TEST_CASE("variant order: over two rounds each variant runs first once and follows each other") {
  for (size_t n = 2; n <= 5; ++n) {
    const Order a = variant_order(0, n), b = variant_order(1, n);
    CHECK(a.front() != b.front());
    // each variant's positions over the two rounds add up to n − 1: no variant is always early
    for (size_t v = 0; v < n; ++v) {
      const auto at = [v](const Order& o) {
        return static_cast<size_t>(std::find(o.begin(), o.end(), v) - o.begin());
      };
      CHECK(at(a) + at(b) == n - 1);
    }
  }
}
