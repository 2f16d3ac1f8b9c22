// Driver tests: failures inside actors (exceptions, non-finite losses, a lost message, a failing
// data source) stop the pipeline with an error naming stage, microbatch and cause, in bounded
// time; progress callbacks, spans, credits and the compute-free overhead mode.
#include "actors/driver.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>

#include "actors/actor_engine.hpp"
#include "engine/data/loader.hpp"
#include "engine/model/model.hpp"
#include "engine/schedule/generators.hpp"
#include "engine/schedule/lowering.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

Config tiny(const std::string& mode, int d, int m, int steps) {
  Config c = tiny_config(mode, d, m, tiny_model(Arch::gpt, true, ModelOptions{}.init_seed));
  c.train.steps = steps;
  return c;
}

// Runs `c` with `o` and returns the error (the run must fail) and how long it took.
std::pair<std::string, double> run_failing(const Config& c, const ActorEngineOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_actor_pipeline(c, o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE_MESSAGE(!r.ok(), "the run should have failed");
  return {r.error().message, s};
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A data source that fails at one position.
class FailingLoader final : public DataLoader {
 public:
  FailingLoader(std::unique_ptr<DataLoader> inner, uint64_t fail_at)
      : inner_(std::move(inner)), fail_at_(fail_at) {}
  Microbatch next() override {
    if (inner_->position() == fail_at_) throw std::runtime_error("the disk went away");
    return inner_->next();
  }
  uint64_t position() const override { return inner_->position(); }
  void seek(uint64_t p) override { inner_->seek(p); }
  int vocab_size() const override { return inner_->vocab_size(); }
  std::optional<double> entropy_rate() const override { return inner_->entropy_rate(); }
  std::string describe() const override { return "failing " + inner_->describe(); }

 private:
  std::unique_ptr<DataLoader> inner_;
  uint64_t fail_at_;
};

}  // namespace

TEST_CASE("an exception in a forward stops the run naming stage, microbatch and cause" *
          doctest::timeout(60)) {
  ActorEngineOptions o;
  o.fault = {FaultInjection::Kind::throw_in_forward, 1, 2};
  auto [err, seconds] = run_failing(tiny("1f1b", 3, 4, 1), o);
  CHECK(contains(err, "stage 1, microbatch 2 (1F2): injected fault in forward"));
  CHECK(seconds < 30);
}

TEST_CASE("an exception in a backward of a later step stops an async run" * doctest::timeout(60)) {
  ActorEngineOptions o;
  o.fault = {FaultInjection::Kind::throw_in_backward, 0, 5};
  auto [err, seconds] = run_failing(tiny("2bw", 2, 2, 4), o);
  CHECK(contains(err, "stage 0, microbatch 5 (0B5@1): injected fault in backward"));
  CHECK(seconds < 30);
  // a second run of a fresh engine is unaffected
  o.fault = {};
  CHECK(run_actor_pipeline(tiny("2bw", 2, 2, 4), o).ok());
}

TEST_CASE("a poisoned activation gives a non-finite loss at the last stage" *
          doctest::timeout(60)) {
  ActorEngineOptions o;
  o.fault = {FaultInjection::Kind::poison_output, 0, 1};
  auto [err, seconds] = run_failing(tiny("gpipe", 2, 3, 1), o);
  CHECK(contains(err, "stage 1, microbatch 1 (1F1): non-finite loss nan"));
  CHECK(seconds < 30);
  // at the last stage itself (d = 1) the loss is poisoned directly
  o.fault = {FaultInjection::Kind::poison_output, 0, 4};
  auto [err1, seconds1] = run_failing(tiny("pipedream", 1, 1, 6), o);
  CHECK(contains(err1, "stage 0, microbatch 4 (0F4@4): non-finite loss"));
}

TEST_CASE("an exploding learning rate gives a non-finite loss after the first update" *
          doctest::timeout(60)) {
  Config c = tiny("xpipe", 3, 2, 4);
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 1e30f;
  c.optimizer.grad_clip = 0.0f;
  auto [err, seconds] = run_failing(c, {});
  CHECK(contains(err, "stage 2, microbatch "));
  CHECK(contains(err, "non-finite loss"));
  CHECK(seconds < 30);
}

TEST_CASE("a NaN learning rate is refused before anything runs") {
  Config c = tiny("1f1b", 2, 2, 1);
  c.optimizer.lr = std::numeric_limits<float>::quiet_NaN();
  auto r = run_actor_pipeline(c);
  REQUIRE(!r.ok());
  CHECK(contains(r.error().message, "optimizer.lr = nan"));
}

TEST_CASE("a lost announcement is reported by the stall watchdog, not a hang" *
          doctest::timeout(60)) {
  ActorEngineOptions o;
  o.fault = {FaultInjection::Kind::drop_activation, 1, 2};
  o.stall_timeout_seconds = 0.3;
  auto [err, seconds] = run_failing(tiny("1f1b", 3, 4, 1), o);
  CHECK(contains(err, "no action completed for 0.3 s"));
  CHECK(contains(err, "stage 2 waits at 2RECV_F2"));
  CHECK(seconds < 10);
}

TEST_CASE("engine options are checked before anything runs") {
  ActorEngineOptions o;
  o.fault = {FaultInjection::Kind::throw_in_forward, 3, 0};
  auto r = ActorEngine::create(tiny("1f1b", 3, 2, 1), o);
  REQUIRE(!r.ok());
  CHECK(contains(r.error().message, "fault injection at stage 3, microbatch 0"));
  o = {};
  o.scheduler_threads = 0;
  CHECK(!ActorEngine::create(tiny("1f1b", 3, 2, 1), o).ok());
  o = {};
  o.stall_timeout_seconds = 0;
  CHECK(!ActorEngine::create(tiny("1f1b", 3, 2, 1), o).ok());
  o = {};
  o.spin_before_wait_us = -1;
  auto spin = ActorEngine::create(tiny("1f1b", 3, 2, 1), o);
  REQUIRE(!spin.ok());
  CHECK(contains(spin.error().message, "spin_before_wait_us = -1, expected >= 0"));
  o = {};
  o.poll_before_wait_us = -1;
  auto poll = ActorEngine::create(tiny("1f1b", 3, 2, 1), o);
  REQUIRE(!poll.ok());
  CHECK(contains(poll.error().message, "poll_before_wait_us = -1, expected >= 0"));
  auto e = ActorEngine::create(tiny("1f1b", 3, 2, 1));
  REQUIRE(e.ok());
  auto data = DataLoader::open({}, Arch::gpt, 24, 2, 6);
  REQUIRE(data.ok());
  CHECK(!(*e)->run(0, **data).ok());
  // a loader of another microbatch shape is refused by the driver
  auto wrong = DataLoader::open({}, Arch::gpt, 24, 3, 6);
  REQUIRE(wrong.ok());
  auto bad = (*e)->run(1, **wrong);
  REQUIRE(!bad.ok());
  CHECK(contains(bad.error().message, "a (3, 6) microbatch, expected (2, 6)"));
}

TEST_CASE("a failing data source stops the run" * doctest::timeout(60)) {
  const Config c = tiny("2bw", 2, 2, 3);
  auto engine = ActorEngine::create(c);
  REQUIRE(engine.ok());
  auto inner = DataLoader::open(c.data, c.model.arch, c.model.vocab_size, 2, 6);
  REQUIRE(inner.ok());
  FailingLoader data(std::move(*inner), 3);
  auto r = (*engine)->run(3, data);
  REQUIRE(!r.ok());
  // the stages' process reads the microbatches; the failure names the data position
  CHECK(
      contains(r.error().message, "the data loader failed at data position 3: the disk went away"));
}

TEST_CASE("progress callbacks come once per step, in order, with the run's losses") {
  for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    CAPTURE(mode);
    const Config c = tiny(mode, 3, 3, 4);
    std::vector<StepProgress> seen;
    ActorCallbacks cb;
    cb.on_step = [&](const StepProgress& p) { seen.push_back(p); };
    auto r = run_actor_pipeline(c, {}, cb);
    REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
    const int per_step = std::string(mode) == "pipedream" ? 1 : 3;
    REQUIRE(seen.size() == 4);
    REQUIRE(r->run.losses.size() == 4);
    for (size_t i = 0; i < seen.size(); ++i) {
      CHECK(seen[i].step == static_cast<int>(i) + 1);
      CHECK(seen[i].steps == 4);
      CHECK(std::memcmp(&seen[i].loss, &r->run.losses[i], sizeof(double)) == 0);
      CHECK(seen[i].tokens == static_cast<int64_t>(i + 1) * per_step * 2 * 6);
      CHECK(seen[i].stages.size() == 3);
      if (i > 0) CHECK(seen[i].seconds >= seen[i - 1].seconds);
    }
    CHECK(r->run.tokens == 4 * per_step * 2 * 6);
    for (const StageTimes& t : r->run.stages) {
      CHECK(t.busy_seconds > 0);
      CHECK(t.idle_seconds >= 0);
      CHECK(t.busy_seconds + t.idle_seconds <= r->run.seconds * 1.01 + 1e-3);
    }
  }
}

TEST_CASE("a step is reported once every stage has committed its update" * doctest::timeout(120)) {
  // updates slowed to 30 ms: a report at the step's last loss (gpipe: after the forwards) would
  // come before them
  for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    CAPTURE(mode);
    const bool pipedream = std::string(mode) == "pipedream";
    const Config c = tiny(mode, 2, pipedream ? 1 : 3, 3);
    ActorEngineOptions o;
    o.record_spans = true;
    o.before_update = [](int, long) { std::this_thread::sleep_for(std::chrono::milliseconds(30)); };
    std::vector<StepProgress> seen;
    ActorCallbacks cb;
    cb.on_step = [&](const StepProgress& p) { seen.push_back(p); };
    auto r = run_actor_pipeline(c, o, cb);
    REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
    REQUIRE(seen.size() == 3);
    // the k-th update span of every stage (hand-off to hand-back) ends before step k's time
    std::vector<std::vector<double>> ends(2);
    for (const ActionSpan& u : r->run.update_spans)
      ends[static_cast<size_t>(u.stage)].push_back(u.end);
    for (size_t k = 0; k < seen.size(); ++k) {
      CAPTURE(k);
      double last = 0.0;
      for (const auto& e : ends) {
        REQUIRE(e.size() == 3);
        last = std::max(last, e[k]);
      }
      CHECK(seen[k].seconds >= last);
    }
    CHECK(seen.back().seconds <= r->run.seconds);
  }
}

TEST_CASE("spans cover every action of every stage in order") {
  const Config c = tiny("xpipe", 4, 4, 2);
  ActorEngineOptions o;
  o.record_spans = true;
  auto r = run_actor_pipeline(c, o);
  REQUIRE(r.ok());
  auto sched = make_schedule(Mode::xpipe, 4, 4, 2);
  REQUIRE(sched.ok());
  auto lowered = lower(*sched);
  REQUIRE(lowered.ok());
  size_t i = 0;
  for (int s = 0; s < 4; ++s) {
    const auto& list = lowered->per_stage[static_cast<size_t>(s)];
    CHECK(r->run.stages[static_cast<size_t>(s)].actions == static_cast<int64_t>(list.size()));
    double last_end = 0.0;
    for (const Action& a : list) {
      REQUIRE(i < r->run.spans.size());
      const ActionSpan& span = r->run.spans[i++];
      CHECK(span.stage == s);
      CHECK(span.action == a);
      CHECK(span.start >= last_end);
      CHECK(span.end >= span.start);
      last_end = span.end;
    }
  }
  CHECK(i == r->run.spans.size());
}

TEST_CASE("credits: microbatches ahead of stage 0's backwards reach exactly the stash bound") {
  struct Case {
    const char* mode;
    int d, m, steps, bound;
  };
  for (const Case& k :
       {Case{"gpipe", 3, 5, 2, 5}, Case{"1f1b", 3, 5, 2, 3}, Case{"1f1b", 4, 2, 2, 2},
        Case{"2bw", 2, 3, 3, 2}, Case{"pipedream", 4, 1, 9, 4}, Case{"xpipe", 3, 1, 6, 3}}) {
    CAPTURE(k.mode);
    CAPTURE(k.d);
    auto r = run_actor_pipeline(tiny(k.mode, k.d, k.m, k.steps));
    REQUIRE(r.ok());
    CHECK(r->run.peak_microbatches_ahead == k.bound);
  }
}

TEST_CASE("skip_compute runs every schedule's messages without touching the weights") {
  for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    CAPTURE(mode);
    const Config c = tiny(mode, 4, 4, 3);
    ActorEngineOptions o;
    o.skip_compute = true;
    auto r = run_actor_pipeline(c, o);
    REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
    for (double l : r->run.losses) CHECK(l == 0.0);
    auto model = Model::build(c.model);
    REQUIRE(model.ok());
    for (int i = 0; i < model->num_layers(); ++i) {
      std::vector<float> init(model->layer(i).param_floats());
      model->init_layer(i, init.data());
      CHECK(std::memcmp(init.data(), r->params[static_cast<size_t>(i)].data(),
                        init.size() * sizeof(float)) == 0);
    }
  }
}
