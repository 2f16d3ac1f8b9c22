// Tests of the simulator: uniform costs reproduce the closed forms (bubble, stash, versions), a
// hand-computed two-stage run with link costs, FIFO links, and cost-model errors.
#include "engine/schedule/simulator.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "engine/schedule/generators.hpp"
#include "engine/schedule/lowering.hpp"

using namespace actorpipe;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

const TimedAction& entry(const Simulation& sim, const std::string& text) {
  for (const TimedAction& t : sim.timeline) {
    if (to_string(t.action) == text) return t;
  }
  FAIL("no timeline entry " << text);
  return sim.timeline.front();
}

}  // namespace

TEST_CASE("gpipe and 1f1b: bubble (d-1)/(m+d-1) and makespan (m+d-1)(F+B)") {
  for (double b : {1.0, 2.0}) {
    for (int d = 1; d <= 8; ++d) {
      for (int m = 1; m <= 16; ++m) {
        for (auto s : {make_gpipe(d, m), make_1f1b(d, m)}) {
          REQUIRE(s.ok());
          auto sim = simulate(*s, uniform_costs(d, 1.0, b));
          REQUIRE(sim.ok());
          CAPTURE(d);
          CAPTURE(m);
          CAPTURE(to_string(s->mode));
          CHECK(sim->makespan == doctest::Approx((m + d - 1) * (1.0 + b)).epsilon(1e-12));
          CHECK(sim->bubble_fraction ==
                doctest::Approx(static_cast<double>(d - 1) / (m + d - 1)).epsilon(1e-12));
          for (int r = 0; r < d; ++r) CHECK(sim->busy[r] == doctest::Approx(m * (1.0 + b)));
        }
      }
    }
  }
}

TEST_CASE("stash m for gpipe and min(d-r, m) for 1f1b, one weight version") {
  for (int d = 1; d <= 8; ++d) {
    for (int m = 1; m <= 16; ++m) {
      auto g = make_gpipe(d, m);
      auto o = make_1f1b(d, m);
      REQUIRE(g.ok());
      REQUIRE(o.ok());
      auto gs = simulate(*g, uniform_costs(d, 1, 2));
      auto os = simulate(*o, uniform_costs(d, 1, 2));
      REQUIRE(gs.ok());
      REQUIRE(os.ok());
      for (int r = 0; r < d; ++r) {
        CHECK(gs->peak_stash[r] == m);
        CHECK(os->peak_stash[r] == std::min(d - r, m));
        CHECK(gs->versions_kept[r] == 1);
        CHECK(os->versions_kept[r] == 1);
      }
    }
  }
}

TEST_CASE("versions kept: 2 for 2bw, d-r for pipedream, 1 for xpipe") {
  for (int d = 1; d <= 8; ++d) {
    for (int steps : {2, 3}) {
      for (int m = d; m <= 16; m += 5) {
        auto s = make_2bw(d, m, steps);
        REQUIRE(s.ok());
        for (int r = 0; r < d; ++r) CHECK(versions_kept(*s)[r] == 2);
        CHECK(peak_stash(*s) == peak_stash(*make_xpipe(d, m, steps)));
      }
    }
    auto p = make_pipedream(d, 2 * d + 1);
    REQUIRE(p.ok());
    auto sim = simulate(*p, uniform_costs(d, 1, 2));
    REQUIRE(sim.ok());
    for (int r = 0; r < d; ++r) {
      CHECK(sim->versions_kept[r] == d - r);
      CHECK(sim->peak_stash[r] == d - r);
    }
    for (int m = 1; m <= 9; m += 4) {
      auto x = make_xpipe(d, m, 3);
      REQUIRE(x.ok());
      for (int v : versions_kept(*x)) CHECK(v == 1);
    }
  }
  // One 2bw step has nothing in flight at its only update.
  for (int v : versions_kept(*make_2bw(3, 4, 1))) CHECK(v == 1);
}

TEST_CASE("no-flush modes: makespan (N+d-1)(F+B) over all N microbatches") {
  for (int d = 1; d <= 6; ++d) {
    for (int steps = 1; steps <= 3; ++steps) {
      const int m = d + 1, n = m * steps;
      for (auto s : {make_2bw(d, m, steps), make_xpipe(d, m, steps), make_pipedream(d, n)}) {
        REQUIRE(s.ok());
        auto sim = simulate(*s, uniform_costs(d, 1, 2));
        REQUIRE(sim.ok());
        CHECK(sim->makespan == doctest::Approx((n + d - 1) * 3.0));
      }
    }
  }
}

TEST_CASE("two stages with latency, bandwidth and optimizer time, by hand") {
  // gpipe d=2 m=1, F=1, B=2, 100 bytes at 100 B/s (1 s on the wire) + 0.5 s latency, OPT 0.25.
  auto s = make_gpipe(2, 1);
  REQUIRE(s.ok());
  CostModel c = uniform_costs(2, 1, 2);
  c.activation_bytes = {100};
  c.bandwidth = 100;
  c.latency = 0.5;
  c.optimizer = {0.25, 0.25};
  auto sim = simulate(*s, c);
  REQUIRE(sim.ok());
  auto check = [&](const std::string& text, double start, double end) {
    const TimedAction& t = entry(*sim, text);
    CHECK_MESSAGE(t.start == doctest::Approx(start), text);
    CHECK_MESSAGE(t.end == doctest::Approx(end), text);
  };
  check("0F0", 0, 1);
  check("0SEND_F0", 1, 2.5);  // issued at 1, 1 s on the wire, 0.5 s latency
  check("1RECV_F0", 0, 2.5);  // stage 1 waits from the start
  check("1F0", 2.5, 3.5);
  check("1B0", 3.5, 5.5);
  check("1SEND_B0", 5.5, 7);
  check("1OPT_STEP@1", 5.5, 5.75);
  check("0RECV_B0", 1, 7);
  check("0B0", 7, 9);
  check("0OPT_STEP@1", 9, 9.25);
  check("0FLUSH", 9.25, 9.25);  // the barrier: both stages flush together
  check("1FLUSH", 9.25, 9.25);
  CHECK(sim->makespan == doctest::Approx(9.25));
  CHECK(sim->busy[0] == doctest::Approx(3.25));
  CHECK(sim->busy[1] == doctest::Approx(3.25));
  CHECK(sim->bubble_fraction == doctest::Approx((2 * 9.25 - 6.5) / (2 * 9.25)));
  // The timeline is ordered by start time.
  for (size_t i = 1; i < sim->timeline.size(); ++i) {
    CHECK(sim->timeline[i - 1].start <= sim->timeline[i].start);
  }
  const std::string text = format_timeline(*sim);
  CHECK(contains(text, "0SEND_F0"));
  CHECK(contains(text, "9.25"));
}

TEST_CASE("split backward: the gradient leaves backward_weight before its B ends") {
  // by hand: gpipe d=2 m=1, F=1, B=2, stage 1's weight half 0.75
  auto one = make_gpipe(2, 1);
  REQUIRE(one.ok());
  CostModel c = uniform_costs(2, 1, 2);
  c.backward_weight = {0, 0.75};
  auto sim = simulate(*one, c);
  REQUIRE(sim.ok());
  auto check = [&](const std::string& text, double start, double end) {
    const TimedAction& t = entry(*sim, text);
    CHECK_MESSAGE(t.start == doctest::Approx(start), text);
    CHECK_MESSAGE(t.end == doctest::Approx(end), text);
  };
  check("1B0", 2, 4);
  check("1SEND_B0", 3.25, 3.25);  // issued inside the B, which still occupies stage 1
  check("1OPT_STEP@1", 4, 4);
  check("0RECV_B0", 1, 3.25);
  check("0B0", 3.25, 5.25);
  CHECK(sim->makespan == doctest::Approx(5.25));
  // gpipe, every stage alike: stage r's first B starts (B - w) after stage r+1's, so the step
  // is (m+d-1)(F+B) - (d-1)w; the busy time does not change
  for (int d = 1; d <= 5; ++d) {
    for (int m = 1; m <= 6; ++m) {
      auto s = make_gpipe(d, m);
      REQUIRE(s.ok());
      CostModel u = uniform_costs(d, 1, 2);
      u.backward_weight.assign(static_cast<size_t>(d), 0.5);
      auto got = simulate(*s, u);
      REQUIRE(got.ok());
      CAPTURE(d);
      CAPTURE(m);
      CHECK(got->makespan == doctest::Approx((m + d - 1) * 3.0 - (d - 1) * 0.5).epsilon(1e-12));
      for (int r = 0; r < d; ++r) CHECK(got->busy[r] == doctest::Approx(m * 3.0));
    }
  }
}

TEST_CASE("a link carries one transfer at a time, in order") {
  // Two activations of 3 s each leave stage 0 at t=1 and t=2: the second waits for the first.
  auto s = make_gpipe(2, 2);
  REQUIRE(s.ok());
  CostModel c = uniform_costs(2, 1, 1);
  c.activation_bytes = {300};
  c.bandwidth = 100;
  auto sim = simulate(*s, c);
  REQUIRE(sim.ok());
  CHECK(entry(*sim, "1F0").start == doctest::Approx(4));
  CHECK(entry(*sim, "1F1").start == doctest::Approx(7));
  CHECK(entry(*sim, "0SEND_F1").end == doctest::Approx(7));
}

TEST_CASE("a lowered schedule simulates like its compute-only form") {
  auto s = make_1f1b(4, 6);
  REQUIRE(s.ok());
  auto l = lower(*s);
  REQUIRE(l.ok());
  CostModel c = uniform_costs(4, 1, 2);
  c.activation_bytes = {10, 20, 30};
  c.bandwidth = 40;
  c.latency = 0.125;
  auto a = simulate(*s, c);
  auto b = simulate(*l, c);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->makespan == b->makespan);
  CHECK(a->timeline.size() == b->timeline.size());
  CHECK(a->makespan > 27.0);  // transfers only add time to the zero-cost makespan (6+3)*3
}

TEST_CASE("per-layer costs sum per stage") {
  auto v = sum_layers_per_stage({1, 2, 3, 4, 5}, {2, 3});
  REQUIRE(v.ok());
  CHECK(*v == std::vector<double>{3, 12});
  auto short_ = sum_layers_per_stage({1, 2, 3}, {2, 2});
  REQUIRE_FALSE(short_.ok());
  CHECK(contains(short_.error().message, "add up to 4, but there are 3 layer costs"));
  auto long_ = sum_layers_per_stage({1, 2, 3}, {1, 1});
  REQUIRE_FALSE(long_.ok());
  CHECK(contains(long_.error().message, "add up to 2, but there are 3"));
  auto zero = sum_layers_per_stage({1, 2}, {2, 0});
  REQUIRE_FALSE(zero.ok());
  CHECK(contains(zero.error().message, "stage 1 has 0 layers"));
}

TEST_CASE("paired updates: the k-th OPT_STEPs of the pair start together") {
  // xpipe over 3 stages: the last stage reaches each OPT_STEP well before stage 0 does
  auto s = make_xpipe(3, 4, 3);
  REQUIRE(s.ok());
  CostModel c = uniform_costs(3, 1, 2);
  c.optimizer = {0.5, 0.5, 0.5};
  auto free = simulate(*s, c);
  REQUIRE(free.ok());
  c.paired_updates = {{0, 2}};
  auto paired = simulate(*s, c);
  REQUIRE(paired.ok());
  auto update_starts = [](const Simulation& sim, int stage) {
    std::vector<double> t;
    for (const TimedAction& a : sim.timeline)
      if (a.action.stage == stage && a.action.kind == ActionKind::OPT_STEP) t.push_back(a.start);
    return t;
  };
  REQUIRE(update_starts(*paired, 0).size() == 3);
  CHECK(update_starts(*paired, 0) == update_starts(*paired, 2));
  CHECK(update_starts(*free, 2)[0] < update_starts(*free, 0)[0]);  // unpaired: the last is early
  // the last stage's wait delays its later actions, and through them everybody's
  for (size_t k = 0; k < 3; ++k) CHECK(update_starts(*paired, 2)[k] > update_starts(*free, 2)[k]);
  CHECK(paired->makespan > free->makespan);
}

TEST_CASE("bad cost models and schedules are rejected") {
  auto s = make_1f1b(3, 3);
  REQUIRE(s.ok());
  CostModel c = uniform_costs(2, 1, 2);
  auto e = simulate(*s, c);
  REQUIRE_FALSE(e.ok());
  CHECK(contains(e.error().message, "forward has 2 entries, expected 3"));
  c = uniform_costs(3, 1, 2);
  c.backward[1] = -1;
  e = simulate(*s, c);
  REQUIRE_FALSE(e.ok());
  CHECK(contains(e.error().message, "backward[1] = -1 is not allowed"));
  c = uniform_costs(3, 1, 2);
  c.activation_bytes = {1, 2, 3};
  e = simulate(*s, c);
  REQUIRE_FALSE(e.ok());
  CHECK(contains(e.error().message, "activation_bytes has 3 entries, expected 2 (or none)"));
  c = uniform_costs(3, 1, 2);
  c.backward_weight = {0, 2.5, 0};
  e = simulate(*s, c);
  REQUIRE_FALSE(e.ok());
  CHECK(contains(e.error().message, "backward_weight[1] = 2.5 is not allowed"));
  c = uniform_costs(3, 1, 2);
  c.paired_updates = {{0, 3}};
  e = simulate(*s, c);
  REQUIRE_FALSE(e.ok());
  CHECK(contains(e.error().message,
                 "paired_updates (0, 3) is not allowed: two different stages in [0, 3)"));
  Schedule broken = *s;
  broken.per_stage[0].erase(broken.per_stage[0].begin());
  e = simulate(broken, uniform_costs(3, 1, 2));
  REQUIRE_FALSE(e.ok());
  CHECK(contains(e.error().message, "<-- ERROR HERE"));
}

TEST_CASE("simulator: the all-reduce lengthens every OPT_STEP") {
  auto s = make_schedule(Mode::gpipe, 2, 2, 1);
  REQUIRE(s.ok());
  CostModel c = uniform_costs(2, 1.0, 2.0);
  auto plain = simulate(*s, c);
  REQUIRE(plain.ok());
  c.allreduce = {0.5, 3.0};
  auto summed = simulate(*s, c);
  REQUIRE(summed.ok());
  // gpipe, f = 1, b = 2: stage 1's last B ends at 7, stage 0's at 9 (then free updates): the
  // step now ends with stage 1's OPT_STEP at 7 + 3 = 10, after stage 0's at 9 + 0.5
  CHECK(plain->makespan == doctest::Approx(9.0));
  CHECK(summed->makespan == doctest::Approx(10.0));
  CHECK(summed->busy[0] == doctest::Approx(plain->busy[0] + 0.5));
  CHECK(summed->busy[1] == doctest::Approx(plain->busy[1] + 3.0));
  c.allreduce = {1.0};
  CHECK_FALSE(simulate(*s, c).ok());
}
