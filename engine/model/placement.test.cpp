// Placement: stages on the ranks of a job, by default in contiguous blocks, or as configured;
// every rank holds a stage.
#include "engine/model/placement.hpp"

#include <doctest/doctest.h>

namespace actorpipe {

TEST_CASE("placement: contiguous blocks by default, one stage per process when world == stages") {
  CHECK(Placement(3).ranks() == std::vector<int>{0, 0, 0});
  CHECK(Placement::make({}, 4, 4)->ranks() == std::vector<int>{0, 1, 2, 3});
  CHECK(Placement::make({}, 4, 2)->ranks() == std::vector<int>{0, 0, 1, 1});
  CHECK(Placement::make({}, 3, 2)->ranks() == std::vector<int>{0, 0, 1});
  CHECK(Placement::make({}, 5, 1)->ranks() == std::vector<int>{0, 0, 0, 0, 0});
  auto p = Placement::make({1, 0, 1}, 3, 2);
  REQUIRE(p.ok());
  CHECK(p->rank_of(0) == 1);
  CHECK(p->stages_of(1) == std::vector<int>{0, 2});
  CHECK(p->stages_of(0) == std::vector<int>{1});
  CHECK(p->world() == 2);
  CHECK(p->describe() == "[1, 0, 1]");
}

TEST_CASE("placement: errors name the placement, the world and what is allowed") {
  auto more = Placement::make({}, 2, 3);
  REQUIRE_FALSE(more.ok());
  CHECK(more.error().message.find("a job of 3 processes for a pipeline of 2 stages") !=
        std::string::npos);
  auto outside = Placement::make({0, 2}, 2, 2);
  REQUIRE_FALSE(outside.ok());
  CHECK(outside.error().message ==
        "cluster.placement = [0, 2]: rank 2 outside the job's ranks [0, 2) (allowed: ranks of "
        "the 2 processes)");
  auto idle = Placement::make({0, 0, 2}, 3, 3);
  REQUIRE_FALSE(idle.ok());
  CHECK(idle.error().message.find("rank 1 of the 3 processes runs no stage") != std::string::npos);
  CHECK_FALSE(Placement::make({0}, 2, 1).ok());
  CHECK_FALSE(Placement::make({}, 0, 1).ok());
}

}  // namespace actorpipe
