// Optimizer-shard actor tests: the shard owns the stage's optimizer state and applies updates on
// its own thread: in 2bw the stage computes the next step while its shard writes the next
// version; an action that needs a version waits for it; slowed updates change no bit.
#include "actors/optimizer_actor.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "actors/actor_engine.hpp"
#include "engine/data/loader.hpp"
#include "engine/execution/optimizer_shard.hpp"
#include "engine/execution/serial_executor.hpp"
#include "engine/execution/stage_worker.hpp"
#include "engine/mode.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

Config tiny(const std::string& mode, int d, int m) {
  Config c = tiny_config(mode, d, m, tiny_model(Arch::gpt, true, 5));
  c.optimizer = clipped_adamw();
  c.data.seed = 3;
  return c;
}

// The worker of an earlier design exposed the optimizer state it held.
template <class W>
concept exposes_optimizer_state = requires(W& w) {
  w.optimizer_state(0);
};

// The update spans of stage r in order: the k-th produces version k (a run's first version).
std::vector<const ActionSpan*> updates_of(const ActorRunResult& r, int stage) {
  std::vector<const ActionSpan*> out;
  for (const ActionSpan& u : r.update_spans) {
    if (u.stage != stage) continue;
    REQUIRE(u.action.kind == ActionKind::OPT_STEP);
    out.push_back(&u);
  }
  return out;
}

// Every F and B computing with version v, and the OPT_STEP producing v + 1, start after the
// update that produces v has ended. Versions count from the run's start: a sync mode repeats a
// one-step schedule (its F and B use the number of updates before them), an async schedule
// names them.
void check_waits(const ActorRunResult& r, int stages, bool sync) {
  for (int s = 0; s < stages; ++s) {
    const auto ups = updates_of(r, s);
    int opt_steps = 0;
    for (const ActionSpan& a : r.spans) {
      if (a.stage != s) continue;
      int v = 0;
      if (a.action.kind == ActionKind::OPT_STEP) {
        v = opt_steps++;
      } else if (is_compute(a.action.kind)) {
        v = sync ? opt_steps : a.action.version;
      }
      if (v < 1) continue;
      REQUIRE(v <= static_cast<int>(ups.size()));
      CAPTURE(to_string(a.action));
      CHECK(a.start >= ups[static_cast<size_t>(v - 1)]->end);
    }
  }
}

}  // namespace

TEST_CASE("the worker no longer holds optimizer state: the engine's shards do") {
  static_assert(!exposes_optimizer_state<StageWorker>);
  const Config c = tiny("2bw", 2, 2);
  auto e = ActorEngine::create(c);
  REQUIRE(e.ok());
  auto data = config_loader(c);
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < (*e)->optimizer(r).num_layers(); ++i)
      for (float x : (*e)->optimizer(r).state(i)) REQUIRE(x == 0.0f);
  REQUIRE((*e)->run(3, *data).ok());
  for (int r = 0; r < 2; ++r) {
    const OptimizerShard& o = (*e)->optimizer(r);
    CHECK(o.stage() == r);
    CHECK(o.first_layer() == (*e)->worker(r).first_layer());
    for (int i = 0; i < o.num_layers(); ++i) {
      CHECK(o.state(i).size() == 2 * (*e)->worker(r).params(i).size());  // AdamW: m and v
      bool moved = false;
      for (float x : o.state(i)) moved = moved || x != 0.0f;
      CHECK(moved);
    }
  }
}

TEST_CASE("2bw: each stage computes the next step while its shard writes the next version" *
          doctest::timeout(60)) {
  // d = 2, m = 2, 4 steps: after OPT_STEP@v (v = 1..3) a stage runs step v's forwards and
  // backwards on version v-1 while its shard, slowed to 150 ms per update, writes version v
  static constexpr double kSlow = 0.15;
  const Config c = tiny("2bw", 2, 2);
  ActorEngineOptions o;
  o.record_spans = true;
  o.before_update = [](int, long) {
    std::this_thread::sleep_for(std::chrono::duration<double>(kSlow));
  };
  auto e = ActorEngine::create(c, o);
  REQUIRE(e.ok());
  auto data = config_loader(c);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = (*e)->run(4, *data);
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int s = 0; s < 2; ++s) {
    CAPTURE(s);
    const auto ups = updates_of(*r, s);
    REQUIRE(ups.size() == 4);
    for (size_t k = 0; k < ups.size(); ++k) {
      CHECK(ups[k]->action.version == static_cast<int>(k) + 1);
      CHECK(ups[k]->end - ups[k]->start >= kSlow);
    }
    for (size_t k = 0; k + 1 < ups.size(); ++k) {
      // some F or B of the stage starts while update k+1 is being written, after its hand-off
      const ActionSpan& u = *ups[k];
      int during = 0;
      for (const ActionSpan& a : r->spans) {
        if (a.stage == s && is_compute(a.action.kind) && a.start >= u.start && a.start < u.end) {
          CHECK(a.action.version == u.action.version - 1);  // the current version, not the new
          ++during;
        }
      }
      CAPTURE(k);
      CHECK(during >= 2);  // step k+1's F and B at least
    }
  }
  check_waits(*r, 2, false);
  // 4 updates per stage in sequence, the stages' in parallel, the compute hidden under them
  CHECK(seconds < 4 * kSlow + 2.0);
}

TEST_CASE("slowed updates change no bit and an action needing a version waits for it" *
          doctest::timeout(60)) {
  struct Case {
    const char* mode;
    int d, m, steps;
  };
  for (const Case& k : {Case{"gpipe", 2, 2, 2}, Case{"1f1b", 3, 2, 2}, Case{"2bw", 3, 3, 3},
                        Case{"pipedream", 3, 1, 5}, Case{"xpipe", 2, 2, 3}}) {
    CAPTURE(k.mode);
    const Config c = tiny(k.mode, k.d, k.m);
    auto serial = SerialExecutor::create(c);
    REQUIRE(serial.ok());
    auto ds = config_loader(c);
    auto ls = (*serial)->run(k.steps, *ds);
    REQUIRE(ls.ok());
    ActorEngineOptions o;
    o.record_spans = true;
    // stage r's updates take (r + 1) * 10 ms: the stages' shards finish out of step
    o.before_update = [](int stage, long) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10 * (stage + 1)));
    };
    auto e = ActorEngine::create(c, o);
    REQUIRE(e.ok());
    auto da = config_loader(c);
    auto r = (*e)->run(k.steps, *da);
    REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
    REQUIRE(r->losses.size() == ls->size());
    CHECK(std::memcmp(r->losses.data(), ls->data(), ls->size() * sizeof(double)) == 0);
    for (int s = 0; s < k.d; ++s) {
      CHECK((*e)->worker(s).updates() == (*serial)->worker(s).updates());
      for (int i = 0; i < (*e)->worker(s).num_layers(); ++i) {
        CHECK(same_bits((*e)->worker(s).params(i), (*serial)->worker(s).params(i)));
        CHECK(same_bits((*e)->optimizer(s).state(i), (*serial)->optimizer(s).state(i)));
      }
    }
    check_waits(*r, k.d, is_synchronous(*parse_mode(k.mode)));
  }
}
