// Job plan in one process: pipeline.replicas = 0 means one replica, "auto" is resolved as
// resolve_partition does, and a config with nothing to plan comes back unchanged.
#include "actors/job_plan.hpp"

#include <doctest/doctest.h>

#include "tests/support/temp_dir.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

TEST_CASE("plan_job in one process: replicas 0 is one replica, auto is resolved") {
  Config c = tiny_config("1f1b", 2, 4, tiny_model(Arch::gpt, true, 5));
  c.pipeline.replicas = 0;
  c.pipeline.partition.automatic = true;
  TempDir cache;
  AutoPartitionOptions planning;
  planning.cache_dir = cache.path.string();
  planning.reps = 1;
  CHECK(plans_job(c.pipeline));
  auto planned = plan_job(c, nullptr, planning);
  REQUIRE_MESSAGE(planned.ok(), (planned.ok() ? "" : planned.error().message));
  CHECK(planned->pipeline.replicas == 1);
  CHECK(planned->pipeline.stages == 2);
  CHECK_FALSE(planned->pipeline.partition.automatic);
  CHECK(planned->pipeline.partition.counts.size() == 2);
  CHECK_FALSE(plans_job(planned->pipeline));

  Config fixed = tiny_config("gpipe", 2, 4, tiny_model(Arch::gpt, true, 5));
  auto same = plan_job(fixed, nullptr, planning);
  REQUIRE(same.ok());
  CHECK(same->pipeline.partition == fixed.pipeline.partition);
  CHECK(same->pipeline.replicas == 1);
}
