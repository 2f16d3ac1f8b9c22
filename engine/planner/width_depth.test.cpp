// Width × depth: with a free all-reduce, replicas (no bubble) beat a pipeline; with a slow one,
// the pipeline wins by exactly the all-reduce's time; splits that cannot run are named.
#include "engine/planner/width_depth.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace actorpipe;

namespace {

// n layers of forward 1 s, backward 2 s, no update; `grad` gradient bytes each
std::vector<LayerCosts> uniform(int n, std::int64_t grad) {
  std::vector<LayerCosts> v(static_cast<size_t>(n));
  for (LayerCosts& l : v) {
    l.forward = 1.0;
    l.backward = 2.0;
    l.gradient_bytes = grad;
    l.parameter_bytes = grad;
  }
  return v;
}

PlannerOptions gpipe(int m) {
  PlannerOptions o;
  o.mode = Mode::gpipe;
  o.microbatches = m;
  o.split_backward = false;
  return o;
}

}  // namespace

TEST_CASE("width x depth: a free all-reduce makes replicas fastest, a slow one the pipeline") {
  const auto layers = uniform(4, 1000);
  // 2 processes, 4 microbatches: w 2 × d 1 runs 2 microbatches of 4 layers (2 · 4 · 3 = 24 s);
  // w 1 × d 2 runs gpipe over 2 stages of 2 layers: (4 + 2 - 1) · 6 = 30 s
  auto free = plan_width_depth(layers, gpipe(4), 2);
  REQUIRE(free.ok());
  REQUIRE(free->ranked.size() == 2);
  CHECK(free->ranked[0].replicas == 2);
  CHECK(free->ranked[0].stages == 1);
  CHECK(free->ranked[0].predicted_step_seconds == doctest::Approx(24.0));
  CHECK(free->ranked[1].replicas == 1);
  CHECK(free->ranked[1].predicted_step_seconds == doctest::Approx(30.0));
  CHECK(free->ranked[0].allreduce_seconds == 0.0);

  // the whole model's gradients, 4000 bytes, at 200 bytes/s with 2 members: 2 · 1/2 · 4000 / 200
  // = 20 s per update, plus 1 s latency: replicas take 24 + 21 = 45 s, the pipeline 30 s
  PlannerOptions slow = gpipe(4);
  slow.allreduce_bandwidth = 200.0;
  slow.allreduce_latency = 1.0;
  auto r = plan_width_depth(layers, slow, 2);
  REQUIRE(r.ok());
  CHECK(r->ranked[0].replicas == 1);
  CHECK(r->ranked[0].predicted_step_seconds == doctest::Approx(30.0));
  CHECK(r->ranked[1].replicas == 2);
  CHECK(r->ranked[1].allreduce_seconds == doctest::Approx(21.0));
  CHECK(r->ranked[1].predicted_step_seconds == doctest::Approx(45.0));
  CHECK(r->ranked[1].plan.stages[0].allreduce_seconds == doctest::Approx(21.0));
  CHECK(r->ranked[1].to_string() ==
        "w 2 × d 1: [4], predicted step 45.000 s (all-reduce 21.000 s)");
}

TEST_CASE("width x depth: 4 processes, with the all-reduce in every stage's update") {
  // 2 × 2: each replica 2 microbatches over 2 stages: (2 + 1) · 6 = 18 s, then each stage sums
  // its 2000 gradient bytes: 2 · 1/2 · 2000 / 1000 = 2 s at the end of the step: 20 s
  PlannerOptions o = gpipe(4);
  o.allreduce_bandwidth = 1000.0;
  auto r = plan_width_depth(uniform(4, 1000), o, 4);
  REQUIRE(r.ok());
  bool found = false;
  for (const WidthDepthPlan& p : r->ranked) {
    if (p.replicas != 2) continue;
    found = true;
    CHECK(p.stages == 2);
    CHECK(p.plan.layers_per_stage == std::vector<int>{2, 2});
    CHECK(p.allreduce_seconds == doctest::Approx(2.0));
    CHECK(p.predicted_step_seconds == doctest::Approx(20.0));
  }
  CHECK(found);
}

TEST_CASE("width x depth: splits that cannot run are named, and none at all is an error") {
  auto r = plan_width_depth(uniform(4, 8), gpipe(6), 4);
  REQUIRE(r.ok());
  std::string skipped;
  for (const std::string& s : r->skipped) skipped += s + "\n";
  CHECK(skipped.find("w 4 × d 1: pipeline.microbatches = 6 is not a multiple of 4") !=
        std::string::npos);
  CHECK(r->ranked.size() == 2);  // 1 × 4 and 2 × 2

  PlannerOptions pd = gpipe(4);
  pd.mode = Mode::pipedream;
  auto p = plan_width_depth(uniform(4, 8), pd, 2);
  REQUIRE(p.ok());
  REQUIRE(p->ranked.size() == 1);
  CHECK(p->ranked[0].replicas == 1);
  CHECK(p->skipped.at(0) == "w 2 × d 1: mode pipedream runs no replicas");

  // 2bw needs m/w >= d, that is m >= w·d: with m = 2 no split of 4 processes can run it
  PlannerOptions twobw = gpipe(2);
  twobw.mode = Mode::twobw;
  auto b = plan_width_depth(uniform(4, 8), twobw, 4);
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().message.find("w 2 × d 2: ") != std::string::npos);
  CHECK(b.error().message.find("w 4 × d 1: pipeline.microbatches = 2 is not a multiple of 4") !=
        std::string::npos);

  auto none = plan_width_depth(uniform(2, 8), pd, 4);
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().message.find("width × depth: no split of 4 processes can run: w 1 × d 4: 4 "
                                  "stages for 2 layers") == 0);
  CHECK_FALSE(plan_width_depth(uniform(2, 8), gpipe(2), 0).ok());
}
