// Migration policy: the decision rule on hand-made profiles — patience, the planner's partition,
// stage speeds from measured busy time, min_gain and the cost of the move.
#include "engine/migration/migration_policy.hpp"

#include <doctest/doctest.h>

using namespace actorpipe;

namespace {

// 8 equal layers: F = 1, B = 2 seconds per microbatch, no update time, 1000 bytes to move each.
std::vector<LayerCosts> equal_layers() {
  std::vector<LayerCosts> layers(8);
  for (LayerCosts& l : layers) {
    l.forward = 1;
    l.backward = 2;
    l.parameter_bytes = 400;
    l.optimizer_bytes = 600;
    l.version_bytes = 400;
  }
  return layers;
}

PlannerOptions two_stages() {
  PlannerOptions p;
  p.mode = Mode::onef1b;
  p.stages = 2;
  p.microbatches = 4;
  return p;
}

MigrationPolicy policy(MigrationOptions o) {
  auto layers = equal_layers();
  auto bytes = layer_move_bytes(layers, Mode::onef1b);
  return MigrationPolicy(o, layers, two_stages(), bytes);
}

}  // namespace

TEST_CASE("a bad partition moves after `patience` imbalanced checks, to the planner's plan") {
  MigrationOptions o;
  o.patience = 2;
  MigrationPolicy p = policy(o);
  const std::vector<int> bad = {1, 7};
  // busy per step as profiled: m · (F + B) · layers = 12 and 84 seconds
  const std::vector<double> busy = {12.0 * 5, 84.0 * 5};
  auto first = p.check(5, bad, busy, 5);
  REQUIRE(first.ok());
  CHECK_FALSE(first->move);
  CHECK(first->imbalance == doctest::Approx(84.0 / 48.0 - 1));
  CHECK(first->imbalanced_checks == 1);
  CHECK(first->reason.find("check 1 of 2") != std::string::npos);
  CHECK(first->proposed.empty());
  auto second = p.check(10, bad, busy, 5);
  REQUIRE(second.ok());
  CHECK(second->move);
  CHECK(second->proposed == std::vector<int>{4, 4});
  CHECK(second->speed == std::vector<double>{1.0, 1.0});
  CHECK(second->bytes_to_move == 3 * 1000);
  CHECK(second->predicted_new < second->predicted_now);
  CHECK(second->reason.find("[1, 7] -> [4, 4]") != std::string::npos);
  p.moved(3000, 0.001);
  // balanced now
  auto after = p.check(15, std::vector<int>{4, 4}, std::vector<double>{48.0, 49.0}, 1);
  REQUIRE(after.ok());
  CHECK_FALSE(after->move);
  CHECK(after->reason.find("balanced") == 0);
}

TEST_CASE("a slow stage gets fewer layers: its speed factor comes from busy / profiled") {
  MigrationOptions o;
  o.patience = 1;
  MigrationPolicy p = policy(o);
  // [4, 4] as profiled takes 48 s per step each; stage 1 measures three times that
  auto d = p.check(10, std::vector<int>{4, 4}, std::vector<double>{48.0, 144.0}, 1);
  REQUIRE(d.ok());
  CHECK(d->speed == std::vector<double>{1.0, 3.0});
  // the planner's bottleneck plan is [6, 2]; the simulator ranks the runner-up [7, 1] faster
  // (stage 1's fill and drain cost three times as much) and the manager takes its pick
  PlannerOptions slow = two_stages();
  slow.stage_speed = {1.0, 3.0};
  auto want = plan_partition(equal_layers(), slow);
  REQUIRE(want.ok());
  CHECK(want->plan.layers_per_stage == std::vector<int>{6, 2});
  CHECK(d->proposed == want->ranked.front().layers_per_stage);
  CHECK(d->proposed[1] < 4);
  CHECK(d->predicted_new == want->ranked.front().predicted_step_seconds);
  CHECK(d->move);
  // a stage an eighth slower: moving a layer off it gains under 5%
  MigrationOptions tight = o;
  tight.threshold = 0.05;
  MigrationPolicy q = policy(tight);
  auto eighth = q.check(10, std::vector<int>{4, 4}, std::vector<double>{48.0, 54.0}, 1);
  REQUIRE(eighth.ok());
  CHECK(eighth->imbalance > 0.05);
  CHECK(eighth->speed == std::vector<double>{1.0, 1.125});
  CHECK_FALSE(eighth->move);
  CHECK(eighth->proposed == std::vector<int>{5, 3});
  CHECK(eighth->reason.find("under min_gain 0.050") != std::string::npos);
  // a factor within the threshold of 1 is noise: [3, 5] measured as profiled moves to [4, 4]
  // with both stages at 1
  auto skew = q.check(20, std::vector<int>{3, 5}, std::vector<double>{36.0, 61.0}, 1);
  REQUIRE(skew.ok());
  CHECK(skew->speed == std::vector<double>{1.0, 1.0});
  CHECK(skew->proposed == std::vector<int>{4, 4});
  CHECK(skew->move);
}

TEST_CASE("no move when the gain is under min_gain or does not pay for the move") {
  MigrationOptions o;
  o.patience = 1;
  o.min_gain = 0.9;
  MigrationPolicy greedy = policy(o);
  auto small = greedy.check(10, std::vector<int>{3, 5}, std::vector<double>{36.0, 60.0}, 1);
  REQUIRE(small.ok());
  CHECK(small->proposed == std::vector<int>{4, 4});
  CHECK_FALSE(small->move);
  CHECK(small->reason.find("under min_gain") != std::string::npos);
  o.min_gain = 0.0;
  MigrationPolicy slow_copy = policy(o);
  slow_copy.moved(1, 1e6);  // one byte per million seconds: no move pays
  auto costly = slow_copy.check(10, std::vector<int>{3, 5}, std::vector<double>{36.0, 60.0}, 1);
  REQUIRE(costly.ok());
  CHECK_FALSE(costly->move);
  CHECK(costly->reason.find("less than the move's") != std::string::npos);
}

TEST_CASE("a check with the wrong number of stages is an error") {
  MigrationPolicy p = policy({});
  auto bad = p.check(1, std::vector<int>{8}, std::vector<double>{1.0}, 1);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("1 stage counts and 1 busy times for 2 stages") !=
        std::string::npos);
}
