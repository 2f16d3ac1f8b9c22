// Partition tests: even splits (contiguous, balanced, larger stages first), explicit counts,
// stage_of, and errors that name the problem.
#include "engine/model/partition.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <string>

using namespace actorpipe;

namespace {
bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
}  // namespace

TEST_CASE("even partitions are contiguous, cover every layer and differ by at most one") {
  for (int n = 1; n <= 12; ++n) {
    for (int d = 1; d <= n; ++d) {
      auto p = Partition::even(n, d);
      REQUIRE(p.ok());
      CHECK(p->stages() == d);
      CHECK(p->num_layers() == n);
      const auto c = p->counts();
      const auto [lo, hi] = std::minmax_element(c.begin(), c.end());
      CHECK(*lo >= 1);
      CHECK(*hi - *lo <= 1);
      // the larger stages come first
      CHECK(std::is_sorted(c.begin(), c.end(), std::greater<>()));
      int layer = 0;
      for (int r = 0; r < d; ++r) {
        CHECK(p->begin(r) == layer);
        for (; layer < p->end(r); ++layer) CHECK(p->stage_of(layer) == r);
      }
      CHECK(layer == n);
    }
  }
  CHECK(Partition::even(6, 4)->to_string() == "[2, 2, 1, 1]");
}

TEST_CASE("explicit counts") {
  const int counts[] = {1, 3, 2};
  auto p = Partition::from_counts(6, counts);
  REQUIRE(p.ok());
  CHECK(p->counts() == std::vector<int>{1, 3, 2});
  CHECK(p->begin(1) == 1);
  CHECK(p->end(1) == 4);
  CHECK(p->stage_of(0) == 0);
  CHECK(p->stage_of(3) == 1);
  CHECK(p->stage_of(4) == 2);
  CHECK(*p == *Partition::from_counts(6, std::vector<int>{1, 3, 2}));
}

TEST_CASE("errors name the value and what is allowed") {
  CHECK(contains(Partition::even(4, 0).error().message, "stages = 0: must be at least 1"));
  CHECK(contains(Partition::even(4, 5).error().message, "the model has only 4 layers"));
  CHECK(contains(Partition::from_counts(6, std::vector<int>{3, 4}).error().message,
                 "partition = [3, 4]: sums to 7 but the model has 6 layers"));
  CHECK(contains(Partition::from_counts(6, std::vector<int>{6, 0}).error().message,
                 "stage 1 has 0 layers"));
  CHECK(contains(Partition::from_counts(6, std::vector<int>{}).error().message, "partition = []"));

  PipelineOptions o;
  o.stages = 2;
  o.partition.counts = {2, 2, 2};
  CHECK(contains(Partition::from_options(o, 6).error().message,
                 "pipeline.partition = [2, 2, 2]: 3 entries but pipeline.stages = 2"));
  o.partition.counts = {};
  o.stages = 7;
  CHECK(contains(Partition::from_options(o, 6).error().message, "pipeline.stages = 7"));
  o.stages = 3;
  CHECK(Partition::from_options(o, 6)->counts() == std::vector<int>{2, 2, 2});
  o.partition.counts = {1, 1, 4};
  CHECK(Partition::from_options(o, 6)->counts() == std::vector<int>{1, 1, 4});
  // "auto" is resolved before any stage is built (engine/profiler/auto_partition.hpp)
  o.partition = PartitionSpec{};
  o.partition.automatic = true;
  CHECK(contains(Partition::from_options(o, 6).error().message,
                 "pipeline.partition = \"auto\": the planner chooses the partition before the "
                 "stages are built (resolve_partition"));
}
