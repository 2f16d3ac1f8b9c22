// Tests of the five generators: each validates for d <= 8, m <= 16 and several step counts, has
// the documented action order, and gives every F and B the weight version its mode prescribes.
#include "engine/schedule/generators.hpp"

#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

#include "engine/schedule/lowering.hpp"
#include "engine/schedule/validate.hpp"

using namespace actorpipe;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::vector<Action> of_kind(const std::vector<Action>& list, ActionKind kind) {
  std::vector<Action> out;
  for (const Action& a : list) {
    if (a.kind == kind) out.push_back(a);
  }
  return out;
}

// The compute part of a 1F1B stage: `warmup` F, then F B pairs, then the remaining B, with F
// and B each ascending over 0..n-1; checked without reusing the generator's loop.
void check_1f1b_order(const std::vector<Action>& list, int n, int warmup) {
  std::vector<Action> compute;
  for (const Action& a : list) {
    if (is_compute(a.kind)) compute.push_back(a);
  }
  REQUIRE(compute.size() == static_cast<size_t>(2 * n));
  int next_f = 0, next_b = 0;
  for (size_t i = 0; i < compute.size(); ++i) {
    const Action& a = compute[i];
    // Before the first B: min(warmup + 1, n) forwards. Then F and B alternate while F remain.
    bool expect_f;
    if (next_f < std::min(warmup + 1, n)) {
      expect_f = true;
    } else if (next_f == n) {
      expect_f = false;
    } else {
      expect_f = compute[i - 1].kind == ActionKind::B;
    }
    CHECK(a.kind == (expect_f ? ActionKind::F : ActionKind::B));
    if (a.kind == ActionKind::F) CHECK(a.microbatch == next_f++);
    if (a.kind == ActionKind::B) CHECK(a.microbatch == next_b++);
  }
}

// OPT_STEP sits right after the B of every microbatch j with (j + 1) % every == 0 and produces
// versions 1, 2, ...; the list ends with exactly one FLUSH.
void check_opt_steps(const std::vector<Action>& list, int every) {
  int produced = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    if (a.kind == ActionKind::B && (a.microbatch + 1) % every == 0) {
      REQUIRE(i + 1 < list.size());
      CHECK(list[i + 1].kind == ActionKind::OPT_STEP);
      CHECK(list[i + 1].version == ++produced);
    }
  }
  CHECK(of_kind(list, ActionKind::OPT_STEP).size() == static_cast<size_t>(produced));
  CHECK(of_kind(list, ActionKind::FLUSH).size() == 1);
  CHECK(list.back().kind == ActionKind::FLUSH);
}

}  // namespace

TEST_CASE("every generator validates for d <= 8, m <= 16, lowered or not") {
  for (int d = 1; d <= 8; ++d) {
    for (int m = 1; m <= 16; ++m) {
      std::vector<Expected<Schedule>> all;
      all.push_back(make_gpipe(d, m));
      all.push_back(make_1f1b(d, m));
      for (int steps : {1, 2, 3}) {
        if (m >= d) all.push_back(make_2bw(d, m, steps));
        all.push_back(make_xpipe(d, m, steps));
      }
      all.push_back(make_pipedream(d, m));
      for (auto& s : all) {
        REQUIRE(s.ok());
        auto st = validate(*s);
        CHECK_MESSAGE(st.ok(), (st.ok() ? "" : st.error().message));
        auto l = lower(*s);
        REQUIRE(l.ok());
        auto lst = validate(*l);
        CHECK_MESSAGE(lst.ok(), (lst.ok() ? "" : lst.error().message));
      }
    }
  }
}

TEST_CASE("gpipe: all F, then all B ascending, OPT_STEP, FLUSH, version 0") {
  for (int d = 1; d <= 5; ++d) {
    for (int m = 1; m <= 7; ++m) {
      auto s = make_gpipe(d, m);
      REQUIRE(s.ok());
      CHECK(s->mode == Mode::gpipe);
      CHECK(s->stages == d);
      CHECK(s->microbatches == m);
      CHECK(s->steps == 1);
      for (int r = 0; r < d; ++r) {
        const auto& list = s->per_stage[r];
        REQUIRE(list.size() == static_cast<size_t>(2 * m + 2));
        for (int j = 0; j < m; ++j) {
          CHECK(list[j] == Action{r, ActionKind::F, j, 0, 0});
          CHECK(list[m + j] == Action{r, ActionKind::B, j, 0, 0});
        }
        CHECK(list[2 * m] == Action{r, ActionKind::OPT_STEP, -1, 1, 0});
        CHECK(list[2 * m + 1] == Action{r, ActionKind::FLUSH, -1, 0, 0});
      }
    }
  }
}

TEST_CASE("1f1b: min(d-r-1, m) warm-up forwards, one F one B, drain, version 0") {
  for (int d = 1; d <= 8; ++d) {
    for (int m = 1; m <= 12; ++m) {
      auto s = make_1f1b(d, m);
      REQUIRE(s.ok());
      CHECK(s->mode == Mode::onef1b);
      for (int r = 0; r < d; ++r) {
        check_1f1b_order(s->per_stage[r], m, d - r - 1);
        check_opt_steps(s->per_stage[r], m);
        for (const Action& a : s->per_stage[r]) {
          if (is_compute(a.kind)) CHECK(a.version == 0);
        }
      }
    }
  }
}

TEST_CASE("2bw: 1F1B without flush, OPT_STEP per step, step t uses version max(t-1, 0)") {
  for (int d = 1; d <= 6; ++d) {
    for (int m = d; m <= d + 3; ++m) {
      for (int steps = 1; steps <= 4; ++steps) {
        auto s = make_2bw(d, m, steps);
        REQUIRE(s.ok());
        CHECK(s->mode == Mode::twobw);
        CHECK(s->total_microbatches() == m * steps);
        for (int r = 0; r < d; ++r) {
          check_1f1b_order(s->per_stage[r], m * steps, d - r - 1);
          check_opt_steps(s->per_stage[r], m);
          int opt_steps_done = 0;
          for (const Action& a : s->per_stage[r]) {
            if (a.kind == ActionKind::OPT_STEP) ++opt_steps_done;
            if (!is_compute(a.kind)) continue;
            const int t = a.microbatch / m;
            CHECK(a.version == std::max(t - 1, 0));
            // The version must exist when the action runs: produced by an earlier OPT_STEP.
            CHECK(a.version <= opt_steps_done);
          }
        }
      }
    }
  }
}

TEST_CASE("continued 2bw: the same order, step t uses version t-1 (-1 for step 0)") {
  for (int d = 1; d <= 4; ++d) {
    for (int m = d; m <= d + 2; ++m) {
      for (int steps = 1; steps <= 3; ++steps) {
        auto fresh = make_2bw(d, m, steps);
        auto s = make_2bw(d, m, steps, /*continued=*/true);
        REQUIRE(s.ok());
        CHECK_FALSE(fresh->continued);
        CHECK(s->continued);
        for (int r = 0; r < d; ++r) {
          REQUIRE(s->per_stage[r].size() == fresh->per_stage[r].size());
          for (size_t i = 0; i < s->per_stage[r].size(); ++i) {
            const Action& a = s->per_stage[r][i];
            const Action& b = fresh->per_stage[r][i];
            CHECK(a.kind == b.kind);
            CHECK(a.microbatch == b.microbatch);
            // OPT_STEPs produce 1, 2, ... as in a fresh run; computes use one version less
            if (is_compute(a.kind))
              CHECK(a.version == a.microbatch / m - 1);
            else
              CHECK(a.version == b.version);
          }
        }
      }
    }
  }
  // the text form carries version -1
  const Action f{1, ActionKind::F, 2, -1, 0};
  CHECK(to_string(f) == "1F2@-1");
  auto parsed = parse_action("1F2@-1");
  REQUIRE(parsed.ok());
  CHECK(*parsed == f);
}

TEST_CASE("2bw rejects m < d naming m and d") {
  auto s = make_2bw(4, 3, 2);
  REQUIRE_FALSE(s.ok());
  CHECK(contains(s.error().message, "m = 3"));
  CHECK(contains(s.error().message, "d = 4"));
}

TEST_CASE("pipedream: OPT_STEP after every B, F and B share a version, staleness d-1-r") {
  for (int d = 1; d <= 8; ++d) {
    for (int n : {1, 2, d, 2 * d + 3}) {
      auto s = make_pipedream(d, n);
      REQUIRE(s.ok());
      CHECK(s->mode == Mode::pipedream);
      CHECK(s->microbatches == 1);
      CHECK(s->steps == n);
      for (int r = 0; r < d; ++r) {
        const auto& list = s->per_stage[r];
        check_1f1b_order(list, n, d - r - 1);
        check_opt_steps(list, 1);
        std::map<int, int> f_version;
        int done = 0;  // OPT_STEPs so far at this stage
        for (const Action& a : list) {
          if (a.kind == ActionKind::OPT_STEP) ++done;
          if (a.kind == ActionKind::F) {
            CHECK(a.version == done);
            f_version[a.microbatch] = a.version;
          }
          if (a.kind == ActionKind::B) {
            CHECK(a.version == f_version.at(a.microbatch));
            // Staleness at the B: updates applied since the version it computes with.
            if (a.microbatch >= d - 1 - r) CHECK(done - a.version == d - 1 - r);
          }
        }
      }
    }
  }
}

TEST_CASE("xpipe: 2bw order, F records its version and the updates before its B") {
  for (int d = 1; d <= 6; ++d) {
    for (int m = 1; m <= 8; ++m) {
      for (int steps = 1; steps <= 3; ++steps) {
        auto s = make_xpipe(d, m, steps);
        REQUIRE(s.ok());
        CHECK(s->mode == Mode::xpipe);
        for (int r = 0; r < d; ++r) {
          const auto& list = s->per_stage[r];
          check_1f1b_order(list, m * steps, d - r - 1);
          check_opt_steps(list, m);
          std::map<int, Action> forward;
          int done = 0;
          for (const Action& a : list) {
            if (a.kind == ActionKind::OPT_STEP) ++done;
            if (a.kind == ActionKind::F) {
              CHECK(a.version == done);
              forward[a.microbatch] = a;
            }
            if (a.kind == ActionKind::B) {
              CHECK(a.version == done);  // the latest weights
              CHECK(a.lookahead == 0);
              const Action& f = forward.at(a.microbatch);
              CHECK(f.lookahead == done - f.version);
            }
          }
        }
        if (m >= d) {
          // Same action order as 2bw.
          auto b = make_2bw(d, m, steps);
          REQUIRE(b.ok());
          for (int r = 0; r < d; ++r) {
            REQUIRE(b->per_stage[r].size() == s->per_stage[r].size());
            for (size_t i = 0; i < b->per_stage[r].size(); ++i) {
              CHECK(b->per_stage[r][i].kind == s->per_stage[r][i].kind);
              CHECK(b->per_stage[r][i].microbatch == s->per_stage[r][i].microbatch);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("xpipe lookahead counts the updates between F and B (d=4, m=4, stage 0)") {
  // Stage 0 of 4 runs F0 F1 F2, then F(j) B(j-3) pairs: between F(j) and B(j) run the backwards
  // B(max(j-3, 0)) .. B(j-1), and an OPT_STEP follows B(k) when (k + 1) % 4 == 0.
  auto s = make_xpipe(4, 4, 3);
  REQUIRE(s.ok());
  std::map<int, int> lookahead;
  for (const Action& a : s->per_stage[0]) {
    if (a.kind == ActionKind::F) lookahead[a.microbatch] = a.lookahead;
  }
  REQUIRE(lookahead.size() == 12);
  for (int j = 0; j < 12; ++j) {
    int updates = 0;
    for (int k = std::max(j - 3, 0); k < j; ++k) updates += (k + 1) % 4 == 0 ? 1 : 0;
    CHECK_MESSAGE(lookahead.at(j) == updates, "microbatch ", j);
  }
  // The last stage runs F(j) B(j) back to back: nothing lands in between.
  for (const Action& a : s->per_stage[3]) {
    if (a.kind == ActionKind::F) CHECK(a.lookahead == 0);
  }
}

TEST_CASE("make_schedule dispatches and checks arguments") {
  for (Mode mode : all_modes) {
    auto s = make_schedule(mode, 3, 4, mode == Mode::gpipe || mode == Mode::onef1b ? 1 : 2);
    REQUIRE(s.ok());
    CHECK(s->mode == mode);
    CHECK(validate(*s).ok());
  }
  auto p = make_schedule(Mode::pipedream, 3, 4, 2);
  REQUIRE(p.ok());
  CHECK(p->total_microbatches() == 8);
  auto bad_steps = make_schedule(Mode::gpipe, 2, 2, 3);
  REQUIRE_FALSE(bad_steps.ok());
  CHECK(contains(bad_steps.error().message, "steps = 3"));
  for (auto bad : {make_gpipe(0, 4), make_1f1b(2, 0), make_2bw(2, 2, 0), make_pipedream(-1, 3),
                   make_xpipe(2, 2, 0)}) {
    REQUIRE_FALSE(bad.ok());
    CHECK(contains(bad.error().message, ">= 1"));
  }
  CHECK(contains(make_gpipe(0, 4).error().message, "stages = 0"));
  CHECK(contains(make_1f1b(2, 0).error().message, "microbatches = 0"));
  CHECK(contains(make_xpipe(2, 2, 0).error().message, "steps = 0"));
}
