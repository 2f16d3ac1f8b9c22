// Tests of the validator: hand-broken schedules (dropped, duplicated or reordered actions, a send
// without its receive, cross-waits) are rejected with the right message and the marked grid.
#include "engine/schedule/validate.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "engine/schedule/generators.hpp"
#include "engine/schedule/lowering.hpp"

using namespace actorpipe;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The message's first line.
std::string headline(const std::string& msg) {
  return msg.substr(0, msg.find('\n'));
}

// The single grid line carrying the marker; empty (and a failed check) when there is not
// exactly one.
std::string marked_line(const std::string& msg) {
  std::string found;
  int count = 0;
  size_t pos = 0;
  while (pos < msg.size()) {
    size_t eol = msg.find('\n', pos);
    if (eol == std::string::npos) eol = msg.size();
    std::string line = msg.substr(pos, eol - pos);
    if (contains(line, "<-- ERROR HERE")) {
      found = line;
      ++count;
    }
    pos = eol + 1;
  }
  CHECK(count == 1);
  return found;
}

// Expects `s` to be rejected with `what` in the first line and the marker on stage `stage`'s row,
// around the cell `cell` (no bracketed cell when `cell` is empty).
void expect_rejected(const Schedule& s, const std::string& what, int stage,
                     const std::string& cell) {
  Status st = validate(s);
  REQUIRE_FALSE(st.ok());
  const std::string& msg = st.error().message;
  INFO(msg);
  CHECK(contains(headline(msg), what));
  const std::string line = marked_line(msg);
  CHECK(line.rfind(fmt::format("{:>5} |", stage), 0) == 0);
  if (!cell.empty()) {
    CHECK(contains(line, "[" + cell + "]"));
  } else {
    CHECK_FALSE(contains(msg, "["));
  }
}

Schedule one_f_one_b(int d, int m) {
  auto s = make_1f1b(d, m);
  REQUIRE(s.ok());
  return *s;
}

Schedule lowered(Schedule s) {
  auto l = lower(s);
  REQUIRE(l.ok());
  return *l;
}

int find(const std::vector<Action>& list, ActionKind kind, int mb) {
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].kind == kind && list[i].microbatch == mb) return static_cast<int>(i);
  }
  FAIL("action not found");
  return -1;
}

void erase(std::vector<Action>& list, ActionKind kind, int mb) {
  list.erase(list.begin() + find(list, kind, mb));
}

}  // namespace

TEST_CASE("generated schedules pass") {
  CHECK(validate(one_f_one_b(4, 8)).ok());
  CHECK(validate(lowered(one_f_one_b(4, 8))).ok());
}

TEST_CASE("dropped F is reported as missing at its B") {
  Schedule s = one_f_one_b(3, 4);
  erase(s.per_stage[1], ActionKind::F, 2);
  expect_rejected(s, "stage 1, action", 1, "1B2");
  expect_rejected(s, "F of microbatch 2 is missing (its B is here)", 1, "1B2");
}

TEST_CASE("dropped B is reported as missing at its F") {
  Schedule s = one_f_one_b(3, 4);
  erase(s.per_stage[2], ActionKind::B, 3);
  expect_rejected(s, "B of microbatch 3 is missing (its F is here)", 2, "2F3");
}

TEST_CASE("dropped F and B of one microbatch mark the row") {
  Schedule s = one_f_one_b(3, 4);
  erase(s.per_stage[0], ActionKind::F, 1);
  erase(s.per_stage[0], ActionKind::B, 1);
  expect_rejected(s, "stage 0: F of microbatch 1 is missing", 0, "");
}

TEST_CASE("duplicated F") {
  Schedule s = one_f_one_b(4, 6);
  auto& list = s.per_stage[2];
  const int at = find(list, ActionKind::F, 1);
  list.insert(list.begin() + at + 1, list[at]);
  expect_rejected(s, fmt::format("duplicate F of microbatch 1 (first at action {})", at), 2, "2F1");
  // The second occurrence is the one marked.
  Status st = validate(s);
  CHECK(contains(headline(st.error().message), fmt::format("action {} (2F1)", at + 1)));
}

TEST_CASE("B before its F") {
  Schedule s = one_f_one_b(3, 3);
  auto& list = s.per_stage[2];  // last stage: 2F0 2B0 2F1 2B1 ...
  std::swap(list[find(list, ActionKind::F, 1)], list[find(list, ActionKind::B, 1)]);
  expect_rejected(s, "B of microbatch 1 runs before its F", 2, "2B1");
}

TEST_CASE("a send without its receive, and a receive without its send") {
  {
    Schedule s = lowered(one_f_one_b(3, 4));
    erase(s.per_stage[2], ActionKind::RECV_F, 1);
    expect_rejected(s,
                    "SEND_F of microbatch 1 has no matching RECV_F at stage 2 (a send without its "
                    "receive)",
                    1, "1SEND_F1");
  }
  {
    Schedule s = lowered(one_f_one_b(3, 4));
    erase(s.per_stage[1], ActionKind::SEND_B, 0);
    expect_rejected(s,
                    "RECV_B of microbatch 0 has no matching SEND_B at stage 1 (a receive without "
                    "its send)",
                    0, "0RECV_B0");
  }
}

TEST_CASE("a receive after the action it feeds") {
  Schedule s = lowered(one_f_one_b(2, 2));
  auto& list = s.per_stage[1];
  const int recv = find(list, ActionKind::RECV_F, 1);
  std::swap(list[recv], list[recv + 1]);  // 1F1 before 1RECV_F1
  expect_rejected(s, "F of microbatch 1 has no RECV_F before it", 1, "1F1");
}

TEST_CASE("a cross-wait deadlock in a lowered schedule") {
  // Stage 0 waits for the gradient before it sends the activation stage 1 is waiting for.
  Schedule s = lowered(one_f_one_b(2, 1));
  auto& list = s.per_stage[0];  // 0F0 0SEND_F0 0RECV_B0 0B0 0OPT_STEP@1 0FLUSH
  std::swap(list[find(list, ActionKind::SEND_F, 0)], list[find(list, ActionKind::RECV_B, 0)]);
  expect_rejected(s,
                  "deadlock: no stage can proceed: stage 0 waits at 0RECV_B0 for 1SEND_B0, but "
                  "stage 1 is blocked earlier at 1RECV_F0; stage 1 waits at 1RECV_F0 for "
                  "0SEND_F0, but stage 0 is blocked earlier at 0RECV_B0",
                  0, "0RECV_B0");
}

TEST_CASE("a cross-wait deadlock in a compute-only schedule") {
  // Stage 0 wants B0 from stage 1 before it runs F1; stage 1 wants F1 before it runs B0.
  Schedule s{Mode::onef1b, 2, 2, 1, {}};
  auto act = [](int r, ActionKind k, int mb) { return Action{r, k, mb, 0, 0}; };
  s.per_stage = {{act(0, ActionKind::F, 0), act(0, ActionKind::B, 0), act(0, ActionKind::F, 1),
                  act(0, ActionKind::B, 1)},
                 {act(1, ActionKind::F, 0), act(1, ActionKind::F, 1), act(1, ActionKind::B, 0),
                  act(1, ActionKind::B, 1)}};
  expect_rejected(s,
                  "stage 0 waits at 0B0 for 1B0, but stage 1 is blocked earlier at 1F1; stage 1 "
                  "waits at 1F1 for 0F1, but stage 0 is blocked earlier at 0B0",
                  0, "0B0");
}

TEST_CASE("a missing FLUSH deadlocks the barrier") {
  Schedule s = one_f_one_b(3, 3);
  s.per_stage[2].pop_back();
  expect_rejected(s, "stage 0 waits at 0FLUSH for every stage to reach its FLUSH #1", 0, "0FLUSH");
}

TEST_CASE("FLUSH with a microbatch in flight") {
  Schedule s = one_f_one_b(2, 3);
  auto& list = s.per_stage[0];
  const Action flush = list.back();
  list.pop_back();
  list.insert(list.begin() + find(list, ActionKind::B, 2), flush);
  expect_rejected(s, "FLUSH with microbatch 2 in flight", 0, "0FLUSH");
}

TEST_CASE("OPT_STEP versions must count up") {
  auto p = make_pipedream(2, 4);
  REQUIRE(p.ok());
  Schedule s = *p;
  for (Action& a : s.per_stage[1]) {
    if (a.kind == ActionKind::OPT_STEP && a.version == 3) a.version = 4;
  }
  expect_rejected(s, "OPT_STEP produces version 4, expected 3", 1, "1OPT_STEP@4");
}

TEST_CASE("malformed actions") {
  {
    Schedule s = one_f_one_b(3, 2);
    s.per_stage[1][0].stage = 2;
    expect_rejected(s, "the action names stage 2 but is in stage 1's list", 1, "2F0");
  }
  {
    Schedule s = one_f_one_b(3, 2);
    s.per_stage[0][1].microbatch = 2;
    expect_rejected(s, "microbatch 2 is out of range: allowed 0..1", 0, "0F2");
  }
  {
    Schedule s = one_f_one_b(2, 2);
    s.per_stage[1].insert(s.per_stage[1].begin(), Action{1, ActionKind::SEND_F, 0, 0, 0});
    expect_rejected(s, "SEND_F at the last stage: there is no next stage", 1, "1SEND_F0");
  }
  {
    Schedule s = one_f_one_b(2, 2);
    s.per_stage[0].back().microbatch = 0;
    Status st = validate(s);
    REQUIRE_FALSE(st.ok());
    CHECK(contains(headline(st.error().message), "FLUSH carries microbatch 0; it must be -1"));
  }
}

TEST_CASE("bad shape") {
  Schedule s = one_f_one_b(3, 2);
  s.per_stage.pop_back();
  Status st = validate(s);
  REQUIRE_FALSE(st.ok());
  CHECK(contains(st.error().message, "2 action lists for 3 stages"));
  Schedule z = one_f_one_b(2, 2);
  z.steps = 0;
  st = validate(z);
  REQUIRE_FALSE(st.ok());
  CHECK(contains(st.error().message, "steps = 0, must be >= 1"));
}
