// Tests of the pipeline timing: step times from the driver's per-step reports, the replaying
// data loader, and short runs of the actor engine (with and without compute) on a micro GPT.
#include "bench/pipeline_timing.hpp"

#include <doctest/doctest.h>

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {

PipelineRunSpec micro(Mode mode, int stages, int m) {
  PipelineRunSpec s;
  s.model.vocab_size = 24;
  s.model.context = 8;
  s.model.width = 8;
  s.model.depth = 2;
  s.model.heads = 2;
  s.B = 2;
  s.T = 6;
  s.mode = mode;
  s.stages = stages;
  s.microbatches = m;
  s.warmup = 1;
  s.reps = 2;
  return s;
}

}  // namespace

TEST_CASE("step_periods: differences of the group ends after the warm-up steps") {
  const std::vector<double> s = {1, 2, 4, 7, 11, 16};
  CHECK(step_periods(s, 1, 1) == std::vector<double>{1, 2, 3, 4, 5});
  CHECK(step_periods(s, 1, 3) == std::vector<double>{3, 4, 5});
  // groups of 2: t_1 = s[1] = 2, t_2 = s[3] = 7, t_3 = s[5] = 16
  CHECK(step_periods(s, 2, 1) == std::vector<double>{5, 9});
  CHECK(step_periods(s, 2, 2) == std::vector<double>{9});
  CHECK(step_periods(s, 3, 1) == std::vector<double>{12});  // t_1 = 4, t_2 = 16
  CHECK(step_periods(s, 4, 1).empty());                     // one group only
  CHECK(step_periods(s, 1, 6).empty());
}

TEST_CASE("ReplayLoader cycles through the source's first microbatches, indices counting on") {
  DataOptions d;
  auto a = DataLoader::open(d, Arch::gpt, 24, 2, 6);
  auto b = DataLoader::open(d, Arch::gpt, 24, 2, 6);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  ReplayLoader replay(**a, 3);
  std::vector<Microbatch> first;
  for (int i = 0; i < 3; ++i) first.push_back((*b)->next());
  for (int i = 0; i < 7; ++i) {
    const Microbatch mb = replay.next();
    CHECK(mb.tokens == first[static_cast<size_t>(i % 3)].tokens);
    CHECK(mb.targets == first[static_cast<size_t>(i % 3)].targets);
    CHECK(mb.index == i);
  }
  CHECK(replay.position() == 7);
  replay.seek(1);
  CHECK(replay.next().tokens == first[1].tokens);
  CHECK(replay.vocab_size() == 24);
  CHECK(replay.entropy_rate() == (*b)->entropy_rate());
}

TEST_CASE("measure_pipeline: every mode on two stages gives reps steps and per-stage busy") {
  for (Mode mode : all_modes) {
    // four timed steps: a stage's action that straddles the window's start or end counts whole
    // in it, so over two steps a preempted action on a loaded machine could pass 1.5 alone
    PipelineRunSpec s = micro(mode, 2, 3);
    s.reps = 4;
    auto r = measure_pipeline(s);
    REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
    CHECK(r->step_seconds_all.size() == 4);
    for (double t : r->step_seconds_all) CHECK(t > 0);
    CHECK(r->tokens_per_s == doctest::Approx(3.0 * 2 * 6 / r->step_seconds));
    REQUIRE(r->stage_busy.size() == 2);
    for (double b : r->stage_busy) {
      CHECK(b > 0);
      CHECK(b < 1.5);  // a share of the timed steps (timer granularity aside)
    }
    CHECK(r->first_loss > 2.5);  // ≈ ln 24 = 3.18 at initialisation
    CHECK(r->first_loss < 4.0);
  }
}

TEST_CASE("measure_pipeline: compute-free runs repeat, and bad specs are errors") {
  PipelineRunSpec s = micro(Mode::onef1b, 2, 2);
  s.skip_compute = true;
  s.reps = 5;
  s.runs = 3;
  auto r = measure_pipeline(s);
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
  CHECK(r->step_seconds_all.size() == 15);

  PipelineRunSpec bad = micro(Mode::twobw, 2, 1);  // 2bw needs m >= d
  auto e = measure_pipeline(bad);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("2bw") != std::string::npos);
  bad = micro(Mode::gpipe, 2, 2);
  bad.reps = 0;
  CHECK_FALSE(measure_pipeline(bad).ok());
}
