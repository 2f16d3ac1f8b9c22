// Tests of the pipeline prediction: the simulated step time against the closed forms of uniform
// stages, per-stage costs from a profile (the balanced partition's tests are the planner room's).
#include "bench/pipeline_prediction.hpp"

#include <doctest/doctest.h>

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {

CostModel uniform(int d, double f, double b, double opt) {
  CostModel c = uniform_costs(d, f, b);
  c.optimizer.assign(static_cast<size_t>(d), opt);
  return c;
}

LayerProfile synthetic_profile(int layers) {
  LayerProfile p;
  p.threads = 1;
  p.B = 1;
  p.T = 1;
  p.reps = 1;
  for (int i = 0; i < layers; ++i) {
    LayerCost c;
    c.name = std::to_string(i);
    c.forward = i + 1;          // 1, 2, 3, ...
    c.backward = 2 * (i + 1);   // 2, 4, 6, ...
    c.backward_weight = i + 1;  // half of it
    c.update = 0.25;
    c.copy = 0.125;
    c.predict = 0.5;
    p.layers.push_back(c);
  }
  return p;
}

}  // namespace

TEST_CASE("simulated step: flushing modes take (m+d-1)(f+b) plus the slowest update") {
  for (Mode mode : {Mode::gpipe, Mode::onef1b}) {
    for (int d = 1; d <= 3; ++d) {
      for (int m = 1; m <= 8; ++m) {
        CostModel c = uniform(d, 1.0, 2.0, 0.0);
        c.optimizer.back() = 0.75;  // the slowest update, on the last stage
        auto s = simulated_step_seconds(mode, m, c, 1, 3);
        REQUIRE(s.ok());
        CHECK_MESSAGE(*s == doctest::Approx((m + d - 1) * 3.0 + 0.75), to_string(mode), " d ", d,
                      " m ", m);
      }
    }
  }
}

TEST_CASE("simulated step: asynchronous modes keep uniform stages busy, m(f+b) per step") {
  for (Mode mode : {Mode::twobw, Mode::xpipe, Mode::pipedream}) {
    for (int d = 1; d <= 3; ++d) {
      for (int m = d; m <= 8; ++m) {
        auto s = simulated_step_seconds(mode, m, uniform(d, 1.0, 2.0, 0.0), 1, 3);
        REQUIRE(s.ok());
        CHECK_MESSAGE(*s == doctest::Approx(m * 3.0), to_string(mode), " d ", d, " m ", m);
      }
    }
  }
  // one stage: the update follows the step's last backward (pipedream: every backward)
  CHECK(*simulated_step_seconds(Mode::twobw, 4, uniform(1, 1, 2, 0.5), 1, 3) ==
        doctest::Approx(4 * 3.0 + 0.5));
  CHECK(*simulated_step_seconds(Mode::pipedream, 4, uniform(1, 1, 2, 0.5), 1, 3) ==
        doctest::Approx(4 * 3.5));
}

TEST_CASE("simulated step: errors") {
  CHECK_FALSE(simulated_step_seconds(Mode::gpipe, 0, uniform(2, 1, 2, 0), 1, 1).ok());
  CHECK_FALSE(simulated_step_seconds(Mode::gpipe, 2, uniform(2, 1, 2, 0), 0, 1).ok());
  CHECK_FALSE(simulated_step_seconds(Mode::twobw, 1, uniform(2, 1, 2, 0), 1, 1).ok());  // m < d
  CostModel bad = uniform(2, 1, 2, 0);
  bad.forward[0] = -1;
  CHECK_FALSE(simulated_step_seconds(Mode::onef1b, 2, bad, 1, 1).ok());
}

TEST_CASE("stage_costs: sums per stage, a copy where versions are kept, xpipe's prediction") {
  const LayerProfile p = synthetic_profile(3);  // F 1 2 3, B 2 4 6
  const std::vector<int> counts = {2, 1};
  for (Mode mode : all_modes) {
    auto c = stage_costs(p, mode, counts, 4, 3);
    REQUIRE(c.ok());
    CHECK(c->backward == std::vector<double>{6, 6});
    // split_backward: only the stage after the first sends before its weight half
    CHECK(c->backward_weight == std::vector<double>{0, 3});
    auto one_pass = stage_costs(p, mode, counts, 4, 3, false);
    REQUIRE(one_pass.ok());
    CHECK(one_pass->backward_weight.empty());
    // gpipe/1f1b/xpipe: one version; 2bw: two at every stage; pipedream: d - r at stage r
    const bool copy0 = mode == Mode::twobw || mode == Mode::pipedream;
    const bool copy1 = mode == Mode::twobw;
    CHECK(c->optimizer[0] == 0.5 + (copy0 ? 0.25 : 0.0));
    CHECK(c->optimizer[1] == 0.25 + (copy1 ? 0.125 : 0.0));
    if (mode != Mode::xpipe) {
      CHECK(c->forward == std::vector<double>{3, 3});
      continue;
    }
    // xpipe, d = 2, m = 4, 3 steps: stage 0 (warm-up 1) looks one update ahead at the first
    // microbatch of steps 1 and 2, but at step 1's there is no update yet to extrapolate from:
    // 1 of 12 forwards predicts (layers 0 and 1: 0.5 each); the last stage never predicts
    CHECK(c->forward[0] == doctest::Approx(3 + 1.0 * 1 / 12));
    CHECK(c->forward[1] == 3);
  }
  CHECK_FALSE(stage_costs(p, Mode::gpipe, std::vector<int>{2, 2}, 4, 1).ok());
}

TEST_CASE(
    "stage_costs pairs the embedding's and the head's updates where tied gradients are "
    "exchanged") {
  LayerProfile p = synthetic_profile(4);
  for (Mode mode : all_modes) {
    CAPTURE(to_string(mode));
    p.tied = false;
    auto untied = stage_costs(p, mode, std::vector<int>{2, 1, 1}, 4, 2);
    REQUIRE(untied.ok());
    CHECK(untied->paired_updates.empty());
    p.tied = true;
    auto tied = stage_costs(p, mode, std::vector<int>{2, 1, 1}, 4, 2);
    REQUIRE(tied.ok());
    // exchange_grads: gpipe, 1f1b; 2bw, pipedream and xpipe follow the owner and never wait
    const bool exchange = mode == Mode::gpipe || mode == Mode::onef1b;
    CHECK(tied->paired_updates == (exchange ? std::vector<std::pair<int, int>>{{0, 2}}
                                            : std::vector<std::pair<int, int>>{}));
    auto one = stage_costs(p, mode, std::vector<int>{4}, 4, 2);
    REQUIRE(one.ok());
    CHECK(one->paired_updates.empty());  // one stage holds both copies
  }
}

TEST_CASE("predict_pipeline: one stage of gpipe is m(F+B) plus the update") {
  const LayerProfile p = synthetic_profile(3);  // F+B of all layers: 18; update 0.75
  auto r = predict_pipeline(p, Mode::gpipe, std::vector<int>{3}, 4, 1, 2);
  REQUIRE(r.ok());
  CHECK(r->step_seconds == doctest::Approx(4 * 18 + 0.75));
  auto two = predict_pipeline(p, Mode::onef1b, std::vector<int>{2, 1}, 4, 1, 2, false);
  REQUIRE(two.ok());
  CHECK(two->costs.forward == std::vector<double>{3, 3});
  // balanced stages of 9: (m + 1)·9 plus the slowest update (stage 0: 0.5)
  CHECK(two->step_seconds == doctest::Approx(5 * 9 + 0.5));
  // split backward: stage 0 gets its first gradient stage 1's weight half (3) earlier
  auto split = predict_pipeline(p, Mode::onef1b, std::vector<int>{2, 1}, 4, 1, 2);
  REQUIRE(split.ok());
  CHECK(split->step_seconds == doctest::Approx(5 * 9 + 0.5 - 3));
}
