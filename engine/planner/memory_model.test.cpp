// Tests of the memory model: the stage factors each mode's schedule gives (against the numbers
// worked out by hand from the generators), stage bytes by kind per mode, saturation, checks.
#include "engine/planner/memory_model.hpp"

#include <doctest/doctest.h>

#include <limits>
#include <string>
#include <vector>

#include "engine/planner/layer_costs.hpp"
#include "engine/planner/stage_factors.hpp"
#include "engine/schedule/simulator.hpp"

using namespace actorpipe;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::vector<StageFactors> factors(Mode mode, int d, int m) {
  auto f = stage_factors(mode, d, m);
  REQUIRE_MESSAGE(f.ok(), f.error().message);
  return *f;
}

// versions kept, peak stash, updates per step of every stage
std::vector<std::vector<int>> table(const std::vector<StageFactors>& f) {
  std::vector<std::vector<int>> out;
  for (const StageFactors& s : f)
    out.push_back({s.versions_kept, s.peak_stash, s.updates_per_step});
  return out;
}

// Two layers: the first stashes 50 bytes (10 when recomputed), the second 30 (5).
std::vector<LayerCosts> two_layers() {
  LayerCosts a, b;
  a.parameter_bytes = 100;
  a.gradient_bytes = 100;
  a.optimizer_bytes = 200;
  a.version_bytes = 100;
  a.activation_bytes = 50;
  a.recompute_activation_bytes = 10;
  b.parameter_bytes = 10;
  b.gradient_bytes = 10;
  b.optimizer_bytes = 20;
  b.version_bytes = 10;
  b.activation_bytes = 30;
  b.recompute_activation_bytes = 5;
  return {a, b};
}

}  // namespace

TEST_CASE("stage factors: gpipe keeps one version and stashes all m microbatches") {
  CHECK(table(factors(Mode::gpipe, 3, 4)) ==
        std::vector<std::vector<int>>{{1, 4, 1}, {1, 4, 1}, {1, 4, 1}});
}

TEST_CASE("stage factors: 1f1b stashes min(d - r, m)") {
  CHECK(table(factors(Mode::onef1b, 3, 4)) ==
        std::vector<std::vector<int>>{{1, 3, 1}, {1, 2, 1}, {1, 1, 1}});
  CHECK(table(factors(Mode::onef1b, 3, 2)) ==
        std::vector<std::vector<int>>{{1, 2, 1}, {1, 2, 1}, {1, 1, 1}});
}

TEST_CASE("stage factors: 2bw keeps two versions, stashes d - r") {
  CHECK(table(factors(Mode::twobw, 3, 4)) ==
        std::vector<std::vector<int>>{{2, 3, 1}, {2, 2, 1}, {2, 1, 1}});
  CHECK(table(factors(Mode::twobw, 4, 4)) ==
        std::vector<std::vector<int>>{{2, 4, 1}, {2, 3, 1}, {2, 2, 1}, {2, 1, 1}});
}

TEST_CASE(
    "stage factors: pipedream keeps d - r versions, stashes d - r, updates every microbatch") {
  CHECK(table(factors(Mode::pipedream, 3, 2)) ==
        std::vector<std::vector<int>>{{3, 3, 2}, {2, 2, 2}, {1, 1, 2}});
  CHECK(table(factors(Mode::pipedream, 4, 1)) ==
        std::vector<std::vector<int>>{{4, 4, 1}, {3, 3, 1}, {2, 2, 1}, {1, 1, 1}});
}

TEST_CASE("stage factors: xpipe keeps one version (it predicts), stashes d - r for any m") {
  CHECK(table(factors(Mode::xpipe, 3, 2)) ==
        std::vector<std::vector<int>>{{1, 3, 1}, {1, 2, 1}, {1, 1, 1}});
  CHECK(table(factors(Mode::xpipe, 3, 1)) ==
        std::vector<std::vector<int>>{{1, 3, 1}, {1, 2, 1}, {1, 1, 1}});
}

TEST_CASE("stage factors: the generators' errors") {
  auto bad = stage_factors(Mode::twobw, 4, 2);
  REQUIRE_FALSE(bad.ok());
  CHECK(contains(bad.error().message, "m = 2 is less than d = 4"));
  CHECK_FALSE(stage_factors(Mode::gpipe, 0, 2).ok());
  CHECK(contains(stage_factors(Mode::pipedream, 2, 0).error().message, "microbatches = 0"));
  CHECK(contains(planner_schedule(Mode::xpipe, 2, 2, 0).error().message, "steps = 0"));
}

TEST_CASE("stage bytes per mode, worked by hand: both layers on stage 0, the second recomputed") {
  const std::vector<LayerCosts> layers = two_layers();
  const std::vector<bool> second = {false, true};
  // parameters 110, gradients 110, optimizer 220; stashed per microbatch 50 + 5 = 55
  struct Case {
    Mode mode;
    int d, m;
    std::int64_t versions, activations, total;
  };
  for (const Case& c : {
           Case{Mode::gpipe, 2, 4, 0, 4 * 55, 660},        // 1 version, m = 4 stashed
           Case{Mode::onef1b, 2, 4, 0, 2 * 55, 550},       // 1 version, min(d, m) = 2
           Case{Mode::twobw, 2, 4, 110, 2 * 55, 660},      // 2 versions, d = 2
           Case{Mode::pipedream, 3, 1, 220, 3 * 55, 825},  // d = 3 versions, 3 stashed
           Case{Mode::xpipe, 3, 2, 0, 3 * 55, 605},        // 1 version, d = 3 stashed
       }) {
    CAPTURE(to_string(c.mode));
    const StageBytes b = stage_bytes(layers, second, factors(c.mode, c.d, c.m)[0]);
    CHECK(b.parameters == 110);
    CHECK(b.gradients == 110);
    CHECK(b.optimizer == 220);
    CHECK(b.versions == c.versions);
    CHECK(b.activations == c.activations);
    CHECK(b.total() == c.total);
  }
  // no recompute: 80 stashed per microbatch; the last stage of 1f1b stashes one
  const StageBytes plain = stage_bytes(layers, {}, factors(Mode::onef1b, 2, 4)[1]);
  CHECK(plain.activations == 80);
  CHECK(plain.total() == 520);
  CHECK(plain.to_string() ==
        "parameters 110, gradients 110, optimizer 220, versions 0, activations 80");
  // both recomputed at pipedream's stage 1 of 3: 2 versions, 2 stashed
  const StageBytes both = stage_bytes(layers, {true, true}, factors(Mode::pipedream, 3, 1)[1]);
  CHECK(both.versions == 110);
  CHECK(both.activations == 2 * 15);
  CHECK(both.weight_copies == 0);
}

TEST_CASE("stage bytes in bf16: a copy of every stored weight version on top") {
  std::vector<LayerCosts> layers = two_layers();
  layers[0].weight_copy_bytes = 50;  // half of parameter_bytes: 2 bytes a value
  layers[1].weight_copy_bytes = 5;
  // 2bw at stage 0 of 2: two versions stored, each with its copy
  const StageBytes b = stage_bytes(layers, {}, factors(Mode::twobw, 2, 4)[0]);
  CHECK(b.versions == 110);
  CHECK(b.weight_copies == 2 * 55);
  CHECK(b.total() == 110 + 110 + 220 + 110 + 110 + 2 * 80);
  CHECK(b.to_string() ==
        "parameters 110, gradients 110, optimizer 220, versions 110, activations 160, bf16 "
        "copies 110");
  // pipedream's stage 0 of 3 stores three versions; 1f1b one
  CHECK(stage_bytes(layers, {}, factors(Mode::pipedream, 3, 1)[0]).weight_copies == 3 * 55);
  CHECK(stage_bytes(layers, {}, factors(Mode::onef1b, 2, 4)[0]).weight_copies == 55);
  layers[1].weight_copy_bytes = -1;
  CHECK(check_layer_costs(layers).error().message ==
        "layer 1: weight_copy_bytes = -1 is not allowed: it must be >= 0");
}

TEST_CASE("stage bytes saturate instead of overflowing") {
  constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max();
  LayerCosts huge;
  huge.activation_bytes = max / 2;
  huge.parameter_bytes = max / 2;
  const StageBytes b = stage_bytes(std::vector<LayerCosts>{huge}, {}, StageFactors{1, 3, 1});
  CHECK(b.activations == max);
  CHECK(b.total() == max);
  CHECK(saturating_add(max, 1) == max);
  CHECK(saturating_mul(max / 2, 3) == max);
  CHECK(saturating_mul(4, 5) == 20);
}

TEST_CASE("layer cost checks name the layer, the field and the value") {
  std::vector<LayerCosts> layers = two_layers();
  CHECK(check_layer_costs(layers).ok());
  layers[1].forward = -1;
  CHECK(check_layer_costs(layers).error().message ==
        "layer 1: forward = -1 is not allowed: it must be finite and >= 0 seconds");
  layers[1].forward = std::numeric_limits<double>::quiet_NaN();
  CHECK(contains(check_layer_costs(layers).error().message, "layer 1: forward = nan"));
  layers[1].forward = 1;
  layers[0].update = std::numeric_limits<double>::infinity();
  CHECK(contains(check_layer_costs(layers).error().message, "layer 0: update = inf"));
  layers[0].update = 0;
  layers[0].backward = 1;
  layers[0].backward_weight = 2;
  CHECK(contains(check_layer_costs(layers).error().message,
                 "layer 0: backward_weight = 2 is not allowed: it is part of backward = 1"));
  layers[0].backward_weight = 0.5;
  layers[1].recompute_activation_bytes = -3;
  CHECK(check_layer_costs(layers).error().message ==
        "layer 1: recompute_activation_bytes = -3 is not allowed: it must be >= 0");
}

TEST_CASE("stage factors: the schedule read is long enough, a much longer one changes nothing") {
  for (Mode mode : {Mode::twobw, Mode::pipedream, Mode::xpipe}) {
    for (int d = 1; d <= 6; ++d) {
      for (int m = mode == Mode::twobw ? d : 1; m <= d + 2; ++m) {
        CAPTURE(to_string(mode));
        CAPTURE(d);
        CAPTURE(m);
        auto longer = planner_schedule(mode, d, m, 6 * d + 6);
        REQUIRE(longer.ok());
        const std::vector<int> versions = versions_kept(*longer), stash = peak_stash(*longer);
        const std::vector<StageFactors> f = factors(mode, d, m);
        for (int r = 0; r < d; ++r) {
          CHECK(f[r].versions_kept == versions[r]);
          CHECK(f[r].peak_stash == stash[r]);
          CHECK(f[r].updates_per_step == (mode == Mode::pipedream ? m : 1));
        }
      }
    }
  }
}
