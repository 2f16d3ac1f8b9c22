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

TEST_CASE("placement of replicas: each on its own block of ranks, placed alike within it") {
  // 2 replicas of 3 stages on 4 processes: 2 per replica
  auto r0 = Placement::make({}, 3, 4, 2, 0);
  auto r1 = Placement::make({}, 3, 4, 2, 1);
  REQUIRE(r0.ok());
  REQUIRE(r1.ok());
  CHECK(r0->ranks() == std::vector<int>{0, 0, 1});
  CHECK(r1->ranks() == std::vector<int>{2, 2, 3});
  CHECK(r1->first_rank() == 2);
  CHECK(r1->pipeline_world() == 2);
  CHECK(r1->world() == 4);
  CHECK(r1->stages_of(3) == std::vector<int>{2});
  // cluster.placement is in the replica's own ranks
  auto p = Placement::make({1, 0, 1}, 3, 4, 2, 1);
  REQUIRE(p.ok());
  CHECK(p->ranks() == std::vector<int>{3, 2, 3});
  // one stage, two replicas, two processes
  auto dp = Placement::make({}, 1, 2, 2, 1);
  REQUIRE(dp.ok());
  CHECK(dp->ranks() == std::vector<int>{1});

  auto odd = Placement::make({}, 2, 3, 2, 0);
  REQUIRE_FALSE(odd.ok());
  CHECK(odd.error().message ==
        "a job of 3 processes for pipeline.replicas = 2: every replica runs on as many processes "
        "as the others (allowed: a multiple of 2 processes)");
  auto wide = Placement::make({}, 2, 6, 2, 0);
  REQUIRE_FALSE(wide.ok());
  CHECK(wide.error().message.find("each of the 2 replicas runs on 3 of the 6 processes: a job of "
                                  "3 processes for a pipeline of 2 stages") == 0);
}

}  // namespace actorpipe
