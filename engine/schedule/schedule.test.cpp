// Tests of the schedule data type: action text round-trip and errors, the compute-only view,
// unit-cost time slots and the stage x time grid.
#include "engine/schedule/schedule.hpp"

#include <doctest/doctest.h>

#include <string>

#include "engine/schedule/generators.hpp"
#include "engine/schedule/lowering.hpp"

using namespace actorpipe;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("action text examples") {
  CHECK(to_string(Action{2, ActionKind::F, 0, 0, 0}) == "2F0");
  CHECK(to_string(Action{1, ActionKind::SEND_B, 3, 0, 0}) == "1SEND_B3");
  CHECK(to_string(Action{3, ActionKind::B, 17, 2, 0}) == "3B17@2");
  CHECK(to_string(Action{0, ActionKind::F, 9, 0, 1}) == "0F9+1");
  CHECK(to_string(Action{0, ActionKind::F, 9, 4, 2}) == "0F9@4+2");
  CHECK(to_string(Action{0, ActionKind::OPT_STEP, -1, 1, 0}) == "0OPT_STEP@1");
  CHECK(to_string(Action{5, ActionKind::FLUSH, -1, 0, 0}) == "5FLUSH");
  CHECK(to_string(Action{12, ActionKind::RECV_F, 100, 0, 0}) == "12RECV_F100");
}

TEST_CASE("every kind's text round-trips through parse_action") {
  const ActionKind kinds[] = {ActionKind::F,        ActionKind::B,      ActionKind::SEND_F,
                              ActionKind::RECV_F,   ActionKind::SEND_B, ActionKind::RECV_B,
                              ActionKind::OPT_STEP, ActionKind::FLUSH};
  for (ActionKind k : kinds) {
    ActionKind parsed{};
    REQUIRE(from_string(to_string(k), parsed));
    CHECK(parsed == k);
    for (int stage : {0, 7, 31}) {
      for (int mb : {0, 5, 123}) {
        for (int version : {0, 1, 9}) {
          for (int lookahead : {0, 2}) {
            Action a{stage, k, mb, version, lookahead};
            if (k == ActionKind::OPT_STEP || k == ActionKind::FLUSH) {
              a.microbatch = -1;
              a.lookahead = 0;
              if (k == ActionKind::FLUSH) a.version = 0;
            }
            auto back = parse_action(to_string(a));
            REQUIRE_MESSAGE(back.ok(), to_string(a));
            CHECK(*back == a);
          }
        }
      }
    }
  }
}

TEST_CASE("malformed action text is rejected with the expected shape") {
  for (const char* bad :
       {"", "F0", "2X0", "2F", "2F0@", "2F0+", "2F0@1+", "2F0x", "-1F0", "0OPT_STEP", "0OPT_STEP3",
        "0FLUSH1", "2f0", "2F0 ", "1SEND_X1", "1234567890F0", "0F1234567890"}) {
    auto a = parse_action(bad);
    CHECK_MESSAGE(!a.ok(), bad);
    if (!a.ok()) {
      CHECK(contains(a.error().message, fmt::format("'{}'", bad)));
      CHECK(contains(a.error().message, "<stage><KIND><microbatch>"));
    }
  }
  ActionKind k = ActionKind::B;
  CHECK_FALSE(from_string("f", k));
  CHECK(k == ActionKind::B);
}

TEST_CASE("kind classes") {
  CHECK(is_compute(ActionKind::F));
  CHECK(is_compute(ActionKind::B));
  CHECK_FALSE(is_compute(ActionKind::OPT_STEP));
  CHECK(is_comm(ActionKind::SEND_F));
  CHECK(is_comm(ActionKind::RECV_B));
  CHECK_FALSE(is_comm(ActionKind::FLUSH));
}

TEST_CASE("compute_only undoes lowering") {
  for (int d = 1; d <= 4; ++d) {
    auto s = make_1f1b(d, 5);
    REQUIRE(s.ok());
    CHECK_FALSE(is_lowered(*s));
    auto l = lower(*s);
    REQUIRE(l.ok());
    CHECK(is_lowered(*l) == (d > 1));
    CHECK(compute_only(*l) == *s);
  }
}

TEST_CASE("unit slots of gpipe follow the staircase") {
  // F of microbatch j at stage r runs in slot r + j; the B staircase starts after the last
  // stage's last F and descends: B of j at stage r in slot (m + d - 1) + j + (d - 1 - r).
  for (int d = 1; d <= 5; ++d) {
    for (int m = 1; m <= 6; ++m) {
      auto s = make_gpipe(d, m);
      REQUIRE(s.ok());
      auto slots = unit_slots(*s);
      REQUIRE(slots.ok());
      for (int r = 0; r < d; ++r) {
        const auto& list = s->per_stage[r];
        for (size_t i = 0; i < list.size(); ++i) {
          const Action& a = list[i];
          if (a.kind == ActionKind::F) CHECK((*slots)[r][i] == r + a.microbatch);
          if (a.kind == ActionKind::B) {
            CHECK((*slots)[r][i] == (m + d - 1) + a.microbatch + (d - 1 - r));
          }
        }
      }
    }
  }
}

TEST_CASE("grid of gpipe d=2 m=2") {
  auto s = make_gpipe(2, 2);
  REQUIRE(s.ok());
  const std::string expected =
      "stage | 0   1   2   3   4   5           6           7\n"
      "    0 | 0F0 0F1         0B0 0B1         0OPT_STEP@1 0FLUSH\n"
      "    1 |     1F0 1F1 1B0 1B1 1OPT_STEP@1             1FLUSH\n";
  CHECK(format_grid(*s) == expected);
  GridOptions mark;
  mark.mark_stage = 1;
  mark.mark_index = 2;
  const std::string marked = format_grid(*s, mark);
  CHECK(contains(marked, "[1B0]"));
  CHECK(contains(marked, "1FLUSH  <-- ERROR HERE\n"));
  CHECK_FALSE(contains(marked.substr(0, marked.find("    1 |")), "ERROR"));
}

TEST_CASE("grid prints versions on request") {
  auto s = make_pipedream(2, 3);
  REQUIRE(s.ok());
  GridOptions v;
  v.versions = true;
  const std::string with = format_grid(*s, v);
  const std::string without = format_grid(*s);
  CHECK(contains(with, "0F2@1"));
  CHECK_FALSE(contains(without, "F2@"));
  CHECK_FALSE(contains(without, "B0@"));
  CHECK(contains(without, "0F2 "));
}

TEST_CASE("a deadlocking schedule has no slots but still prints") {
  Schedule s{Mode::gpipe, 2, 1, 1, {}};
  s.per_stage = {{{0, ActionKind::B, 0, 0, 0}, {0, ActionKind::F, 0, 0, 0}},
                 {{1, ActionKind::F, 0, 0, 0}, {1, ActionKind::B, 0, 0, 0}}};
  auto slots = unit_slots(s);
  REQUIRE_FALSE(slots.ok());
  CHECK(contains(slots.error().message, "deadlock"));
  CHECK(contains(slots.error().message, "0B0"));
  const std::string grid = format_grid(s);
  CHECK(contains(grid, "0B0"));
  CHECK(contains(grid, "1F0"));
}

TEST_CASE("a grid of actions with wrong stage fields still prints") {
  auto s = make_1f1b(3, 2);
  REQUIRE(s.ok());
  for (auto& list : s->per_stage) {
    for (Action& a : list) a.stage = 7;
  }
  const std::string grid = format_grid(*s);
  CHECK(contains(grid, "7F0"));
  CHECK(unit_slots(*s).ok());
}

TEST_CASE("the first steps of a run are the generator's schedule of that many steps") {
  // every asynchronous mode, d 1-5, m 1-6, runs of 2-7 steps cut after each shorter count,
  // lowered and compute-only: what a stage switches to when its run is cut short
  int checked = 0;
  for (Mode mode : {Mode::twobw, Mode::pipedream, Mode::xpipe}) {
    for (int d = 1; d <= 5; ++d) {
      for (int m = 1; m <= 6; ++m) {
        if (mode == Mode::twobw && m < d) continue;
        if (mode == Mode::pipedream && m > 1) break;  // every microbatch is a step
        for (bool continued : {false, true}) {
          if (continued && mode != Mode::twobw) continue;
          auto make = [&](int steps) {
            return mode == Mode::pipedream ? make_pipedream(d, steps)
                   : mode == Mode::twobw   ? make_2bw(d, m, steps, continued)
                                           : make_xpipe(d, m, steps);
          };
          for (int n = 2; n <= 7; ++n) {
            auto whole = make(n);
            REQUIRE(whole.ok());
            auto lowered = lower(*whole);
            REQUIRE(lowered.ok());
            for (int k = 1; k <= n; ++k) {
              auto part = make(k);
              REQUIRE(part.ok());
              auto part_lowered = lower(*part);
              REQUIRE(part_lowered.ok());
              auto cut = first_steps(*whole, k);
              auto cut_lowered = first_steps(*lowered, k);
              REQUIRE(cut.ok());
              REQUIRE(cut_lowered.ok());
              CAPTURE(to_string(mode));
              CAPTURE(d);
              CAPTURE(m);
              CAPTURE(n);
              CAPTURE(k);
              CHECK(*cut == *part);
              CHECK(*cut_lowered == *part_lowered);
              ++checked;
            }
          }
        }
      }
    }
  }
  CHECK(checked > 1000);
  auto s = make_2bw(2, 2, 3);
  REQUIRE(s.ok());
  CHECK(contains(first_steps(*s, 0).error().message, "expected 1 to 3"));
  CHECK(contains(first_steps(*s, 4).error().message, "the first 4 steps of a schedule of 3"));
}
