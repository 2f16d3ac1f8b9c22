// Tests of lowering: every F/B gets its receive right before and its send right after, the result
// validates, replays in the same order as its compute-only input, and lowering twice is refused.
#include "engine/schedule/lowering.hpp"

#include <doctest/doctest.h>

#include <map>
#include <string>
#include <tuple>

#include "engine/schedule/generators.hpp"
#include "engine/schedule/validate.hpp"

using namespace actorpipe;

TEST_CASE("lowering surrounds every F and B with its communication") {
  for (Mode mode : all_modes) {
    for (int d = 1; d <= 5; ++d) {
      auto s = make_schedule(mode, d, 5, mode == Mode::gpipe || mode == Mode::onef1b ? 1 : 2);
      REQUIRE(s.ok());
      auto l = lower(*s);
      REQUIRE(l.ok());
      CHECK(validate(*l).ok());
      for (int r = 0; r < d; ++r) {
        const auto& in = s->per_stage[r];
        const auto& out = l->per_stage[r];
        size_t j = 0;
        auto expect = [&](ActionKind kind, int mb) {
          REQUIRE(j < out.size());
          CHECK(out[j] == Action{r, kind, mb, 0, 0});
          ++j;
        };
        for (const Action& a : in) {
          if (a.kind == ActionKind::F && r > 0) expect(ActionKind::RECV_F, a.microbatch);
          if (a.kind == ActionKind::B && r < d - 1) expect(ActionKind::RECV_B, a.microbatch);
          REQUIRE(j < out.size());
          CHECK(out[j++] == a);
          if (a.kind == ActionKind::F && r < d - 1) expect(ActionKind::SEND_F, a.microbatch);
          if (a.kind == ActionKind::B && r > 0) expect(ActionKind::SEND_B, a.microbatch);
        }
        CHECK(j == out.size());
      }
    }
  }
}

TEST_CASE("lowered schedules keep the compute order of the unit-cost replay") {
  // In the lowered replay, the compute actions run in the same relative order across stages: the
  // F of a microbatch at stage r+1 starts after the F at stage r, the B at r after the B at r+1.
  auto s = make_1f1b(4, 8);
  REQUIRE(s.ok());
  auto l = lower(*s);
  REQUIRE(l.ok());
  auto slots = unit_slots(*l);
  REQUIRE(slots.ok());
  std::map<std::tuple<int, int, int>, int> at;  // (stage, kind, mb) -> slot
  for (int r = 0; r < 4; ++r) {
    for (size_t i = 0; i < l->per_stage[r].size(); ++i) {
      const Action& a = l->per_stage[r][i];
      at[{r, static_cast<int>(a.kind), a.microbatch}] = (*slots)[r][i];
    }
  }
  const int F = static_cast<int>(ActionKind::F), B = static_cast<int>(ActionKind::B);
  for (int r = 0; r + 1 < 4; ++r) {
    for (int j = 0; j < 8; ++j) {
      CHECK(at.at({r + 1, F, j}) > at.at({r, F, j}));
      CHECK(at.at({r, B, j}) > at.at({r + 1, B, j}));
    }
  }
}

TEST_CASE("lowering a lowered schedule is refused") {
  auto s = make_gpipe(2, 2);
  REQUIRE(s.ok());
  auto l = lower(*s);
  REQUIRE(l.ok());
  auto twice = lower(*l);
  REQUIRE_FALSE(twice.ok());
  CHECK(twice.error().message.find("already has communication actions (found 0SEND_F0)") !=
        std::string::npos);
}

TEST_CASE("one stage has nothing to lower") {
  auto s = make_1f1b(1, 3);
  REQUIRE(s.ok());
  auto l = lower(*s);
  REQUIRE(l.ok());
  CHECK(*l == *s);
}
