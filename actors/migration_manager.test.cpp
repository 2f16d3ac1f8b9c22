// Migration: runs with forced moves equal the same runs without them bit for bit in gpipe, 1f1b
// and 2bw (GPT and BERT, tied embeddings, d = 2, 3, 4, moves in both directions, of one and of
// several layers, across run boundaries); in pipedream and xpipe they equal the serial executor
// given the same drains (a chain of serial runs, the state carried through checkpoint files); a
// checkpoint written after a move resumes exactly; the automatic manager rebalances a bad
// partition to the planner's and the run still equals the serial executor.
#include "actors/migration_manager.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "actors/actor_engine.hpp"
#include "engine/checkpoint/checkpoint.hpp"
#include "engine/checkpoint/pipeline_checkpoint.hpp"
#include "engine/config/forced_moves.hpp"
#include "engine/data/loader.hpp"
#include "engine/execution/optimizer_shard.hpp"
#include "engine/execution/serial_executor.hpp"
#include "engine/execution/stage_worker.hpp"
#include "engine/profiler/auto_partition.hpp"
#include "tests/support/bf16_skip.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

// The tiny model with 4 blocks: 6 layers, so 4 stages still have layers to move.
Config six_layers(Arch arch, const std::string& mode, int d, std::vector<int> partition) {
  ModelOptions m = tiny_model(arch, true, 5);
  m.depth = 4;
  Config c = tiny_config(mode, d, 4, m);
  c.optimizer = clipped_adamw();
  c.data.seed = 3;
  c.pipeline.partition.counts = std::move(partition);
  return c;
}

template <class Engine>
std::vector<float> layer_state(Engine& e, int layer) {
  for (int r = 0; r < e.stages(); ++r) {
    const StageWorker& w = e.worker(r);
    if (layer >= w.first_layer() && layer < w.first_layer() + w.num_layers()) {
      auto s = e.optimizer(r).state(layer - w.first_layer());
      return {s.begin(), s.end()};
    }
  }
  FAIL("layer " << layer << " held by no stage");
  return {};
}

template <class Engine>
std::vector<float> layer_params(Engine& e, int layer) {
  for (int r = 0; r < e.stages(); ++r) {
    const StageWorker& w = e.worker(r);
    if (layer >= w.first_layer() && layer < w.first_layer() + w.num_layers()) {
      auto p = w.params(layer - w.first_layer());
      return {p.begin(), p.end()};
    }
  }
  FAIL("layer " << layer << " held by no stage");
  return {};
}

// Every layer's parameters and optimizer state, and the update counts, equal bit for bit.
template <class A, class B>
void check_same_state(A& a, B& b, int layers) {
  for (int l = 0; l < layers; ++l) {
    CAPTURE(l);
    CHECK(same_bits(layer_params(a, l), layer_params(b, l)));
    CHECK(same_bits(layer_state(a, l), layer_state(b, l)));
  }
  CHECK(a.worker(0).updates() == b.worker(0).updates());
}

std::vector<double> run_engine(ActorEngine& e, DataLoader& data, const std::vector<int>& runs,
                               std::vector<MigrationEvent>* events = nullptr) {
  std::vector<double> losses;
  for (int steps : runs) {
    auto r = e.run(steps, data);
    REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().message));
    losses.insert(losses.end(), r->losses.begin(), r->losses.end());
    if (events) events->insert(events->end(), r->migrations.begin(), r->migrations.end());
  }
  return losses;
}

std::unique_ptr<ActorEngine> engine(const Config& c) {
  auto e = ActorEngine::create(c);
  REQUIRE_MESSAGE(e.ok(), (e.ok() ? "" : e.error().message));
  return std::move(*e);
}

}  // namespace

TEST_CASE("forced moves in gpipe, 1f1b and unclipped 2bw equal the run without them bit for bit") {
  struct Case {
    int d;
    std::vector<int> start;
    std::string moves;
  };
  const std::vector<Case> cases = {
      // one layer each way, two layers at once, stage 0 down to the embedding alone
      {2, {3, 3}, "1: 2, 4; 2: 4, 2; 4: 1, 5"},
      // several boundaries at once; the last stage (the tied head's copy) grows and shrinks
      {3, {2, 2, 2}, "1: 1, 3, 2; 3: 2, 1, 3; 4: 3, 2, 1"},
      {4, {2, 1, 1, 2}, "2: 1, 2, 2, 1; 3: 3, 1, 1, 1; 5: 1, 1, 1, 3"},
      // the tied head's stage rebuilt while the embedding's stage keeps its layers (2bw's copy
      // then loads the owner's previous version from its own)
      {3, {2, 2, 2}, "2: 2, 1, 3; 4: 2, 3, 1"},
  };
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (const char* mode : {"gpipe", "1f1b", "2bw"}) {
      for (const Case& k : cases) {
        const std::string what = fmt::format("{} {}", arch == Arch::gpt ? "gpt" : "bert", mode);
        CAPTURE(what);
        CAPTURE(k.moves);
        Config plain = six_layers(arch, mode, k.d, k.start);
        // 2bw clips each stage's gradients by the stage's own norm, so a move that changes a
        // stage's layers changes its clip scale: without clipping the layout is invisible
        // (with clipping: the serial chain below)
        if (std::string(mode) == "2bw") plain.optimizer.grad_clip = 0;
        Config moving = plain;
        moving.migration.moves = k.moves;
        auto a = engine(plain);
        auto b = engine(moving);
        auto data_a = config_loader(plain), data_b = config_loader(moving);
        std::vector<MigrationEvent> events;
        // runs of 3: the move at step 3 falls on a run boundary
        const auto la = run_engine(*a, *data_a, {3, 3});
        const auto lb = run_engine(*b, *data_b, {3, 3}, &events);
        CHECK(same_bits(la, lb));
        check_same_state(*a, *b, 6);
        CHECK(data_a->position() == data_b->position());
        // every forced move was made, in order, and the stages hold the last one's counts
        auto forced = parse_forced_moves(k.moves);
        REQUIRE(forced.ok());
        REQUIRE(events.size() == forced->size());
        for (size_t i = 0; i < events.size(); ++i) {
          CHECK(events[i].forced);
          CHECK(events[i].moved);
          CHECK(events[i].step == (*forced)[i].step);
          CHECK(events[i].to == (*forced)[i].counts);
          CHECK(events[i].bytes_moved > 0);
          CHECK(events[i].error.empty());
        }
        CHECK(b->config().pipeline.partition.counts == forced->back().counts);
        for (int r = 0; r < k.d; ++r)
          CHECK(b->worker(r).num_layers() == forced->back().counts[static_cast<size_t>(r)]);
      }
    }
  }
}

TEST_CASE("forced moves with a bf16 weight stash equal the run without them, and the f32 stash's") {
  if (actorpipe::testing::skip_without_bf16()) return;
  // 2bw's previous version moves with its linear weights kept in bf16 (widened into the move's
  // state, rounded again in the rebuilt stage); unclipped, so the layout is invisible
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    CAPTURE(static_cast<int>(arch));
    Config plain = six_layers(arch, "2bw", 3, {2, 2, 2});
    plain.optimizer.grad_clip = 0;
    plain.pipeline.precision = "bf16";
    plain.pipeline.stash_precision = "bf16";
    Config moving = plain;
    moving.migration.moves = "1: 1, 3, 2; 3: 2, 1, 3; 4: 3, 2, 1";
    Config moving_f32 = moving;
    moving_f32.pipeline.stash_precision = "fp32";
    auto a = engine(plain);
    auto b = engine(moving);
    auto c = engine(moving_f32);
    auto data_a = config_loader(plain), data_b = config_loader(moving),
         data_c = config_loader(moving_f32);
    std::vector<MigrationEvent> events;
    const auto la = run_engine(*a, *data_a, {3, 3});
    const auto lb = run_engine(*b, *data_b, {3, 3}, &events);
    const auto lc = run_engine(*c, *data_c, {3, 3});
    CHECK(events.size() == 3);
    CHECK(same_bits(la, lb));
    CHECK(same_bits(lb, lc));
    check_same_state(*a, *b, 6);
    check_same_state(*b, *c, 6);
    // after [3, 2, 1]: stages 0 and 1 hold blocks (linear weights to stash), stage 2 the head
    // (BERT's has its MLM dense weight, GPT's only the tied projection, kept in f32)
    CHECK(b->worker(0).store().bf16_stash());
    CHECK(b->worker(1).store().bf16_stash());
    CHECK(b->worker(2).store().bf16_stash() == (arch == Arch::bert));
  }
}

// The serial executor given the same drains: runs split at the moves, each on its partition,
// the state carried from one to the next through a checkpoint directory. Gradients are clipped
// per stage in these modes, so the layout is part of what they compute. (2bw's runs continue
// exactly, its previous version carried: no drain.)
TEST_CASE("forced moves in 2bw, pipedream and xpipe equal the serial executor split at the moves") {
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (const char* mode : {"2bw", "pipedream", "xpipe"}) {
      for (int d : {2, 3}) {
        const std::string what = fmt::format("{} {}", arch == Arch::gpt ? "gpt" : "bert", mode);
        CAPTURE(what);
        CAPTURE(d);
        const std::vector<std::vector<int>> layouts =
            d == 2 ? std::vector<std::vector<int>>{{3, 3}, {2, 4}, {5, 1}}
                   : std::vector<std::vector<int>>{{2, 2, 2}, {1, 3, 2}, {3, 1, 2}};
        Config moving = six_layers(arch, mode, d, layouts[0]);
        moving.migration.moves =
            to_string(std::vector<ForcedMove>{{2, layouts[1]}, {5, layouts[2]}});
        auto e = engine(moving);
        auto data_e = config_loader(moving);
        std::vector<MigrationEvent> events;
        const auto le = run_engine(*e, *data_e, {7}, &events);
        REQUIRE(events.size() == 2);

        TempDir dir;
        auto data_s = config_loader(moving);
        std::vector<double> ls;
        std::unique_ptr<SerialExecutor> serial;
        const std::vector<int> segments = {2, 3, 2};
        for (size_t k = 0; k < segments.size(); ++k) {
          Config c = moving;
          c.migration.moves = "";
          c.pipeline.partition.counts = layouts[k];
          auto next = SerialExecutor::create(c);
          REQUIRE(next.ok());
          if (serial) {
            std::vector<StageWorker*> w;
            std::vector<OptimizerShard*> o;
            for (int r = 0; r < d; ++r) {
              w.push_back(&serial->worker(r));
              o.push_back(&serial->optimizer(r));
            }
            RunPosition pos;
            pos.step = static_cast<int64_t>(k);
            auto path = save_pipeline_checkpoint(dir.path.string(), c, pos, w, o);
            REQUIRE_MESSAGE(path.ok(), (path.ok() ? "" : path.error().message));
            auto loaded = load_checkpoint(*path);
            REQUIRE(loaded.ok());
            std::vector<StageWorker*> nw;
            std::vector<OptimizerShard*> no;
            for (int r = 0; r < d; ++r) {
              nw.push_back(&(*next)->worker(r));
              no.push_back(&(*next)->optimizer(r));
            }
            REQUIRE(load_pipeline_checkpoint(*loaded, nw, no).ok());
          }
          serial = std::move(*next);
          auto run = serial->run(segments[k], *data_s);
          REQUIRE_MESSAGE(run.ok(), (run.ok() ? "" : run.error().message));
          ls.insert(ls.end(), run->begin(), run->end());
        }
        CHECK(same_bits(le, ls));
        check_same_state(*e, *serial, 6);
      }
    }
  }
}

TEST_CASE("a checkpoint written after a move resumes exactly, in the moved layout") {
  for (const char* mode : {"1f1b", "2bw", "xpipe"}) {
    const std::string what = mode;
    CAPTURE(what);
    Config c = six_layers(Arch::gpt, mode, 2, {3, 3});
    c.migration.moves = "2: 1, 5; 5: 4, 2";
    // uninterrupted: 6 steps in runs of 3 and 3
    auto whole = engine(c);
    auto data_w = config_loader(c);
    const auto lw = run_engine(*whole, *data_w, {3, 3});
    // interrupted after 3 steps (after the first move), resumed from its checkpoint
    TempDir dir;
    auto first = engine(c);
    auto data_f = config_loader(c);
    const auto l1 = run_engine(*first, *data_f, {3});
    std::vector<StageWorker*> w;
    std::vector<OptimizerShard*> o;
    for (int r = 0; r < 2; ++r) {
      w.push_back(&first->worker(r));
      o.push_back(&first->optimizer(r));
    }
    RunPosition pos;
    pos.step = 3;
    pos.data_position = data_f->position();
    auto path = save_pipeline_checkpoint(dir.path.string(), first->config(), pos, w, o);
    REQUIRE(path.ok());
    auto info = read_checkpoint_info(*path);
    REQUIRE(info.ok());
    CHECK(info->partition == std::vector<int>{1, 5});  // the manifest names the moved layout
    auto loaded = load_checkpoint(*path);
    REQUIRE(loaded.ok());
    auto resumed = engine(c);  // the config's partition [3, 3]...
    std::vector<StageWorker*> rw;
    std::vector<OptimizerShard*> ro;
    for (int r = 0; r < 2; ++r) {
      rw.push_back(&resumed->worker(r));
      ro.push_back(&resumed->optimizer(r));
    }
    REQUIRE(load_pipeline_checkpoint(*loaded, rw, ro).ok());
    auto data_r = config_loader(c);
    data_r->seek(pos.data_position);
    std::vector<MigrationEvent> events;
    auto l2 = run_engine(*resumed, *data_r, {3}, &events);
    // ...takes the layout of step 2 first, then the move at step 5
    REQUIRE(events.size() == 2);
    CHECK(events[0].to == std::vector<int>{1, 5});
    CHECK(events[0].reason.find("which this run starts past") != std::string::npos);
    CHECK(events[1].to == std::vector<int>{4, 2});
    std::vector<double> joined = l1;
    joined.insert(joined.end(), l2.begin(), l2.end());
    CHECK(same_bits(joined, lw));
    check_same_state(*whole, *resumed, 6);
  }
}

TEST_CASE("migration: a forced move the model cannot take is refused when the engine is made") {
  Config c = six_layers(Arch::gpt, "1f1b", 2, {3, 3});
  c.migration.moves = "2: 3, 3, 0";
  auto bad = ActorEngine::create(c);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("migration.moves") != std::string::npos);
}

TEST_CASE("the automatic manager moves a bad partition to the planner's and equals serial") {
  TempDir cache;
  const char* old = std::getenv("ACTORPIPE_CACHE_DIR");
  const std::string saved = old ? old : "";
  ::setenv("ACTORPIPE_CACHE_DIR", cache.path.c_str(), 1);
  // layers large enough that their compute, not the engine's overhead, is what stages measure
  ModelOptions m = tiny_model(Arch::gpt, true, 5);
  m.vocab_size = 64;
  m.context = 32;
  m.width = 64;
  m.heads = 4;
  m.depth = 6;  // 8 layers
  Config c = tiny_config("1f1b", 2, 4, m);
  c.pipeline.microbatch_size = 4;
  c.pipeline.seq_len = 32;
  c.optimizer = clipped_adamw();
  c.pipeline.partition.counts = {1, 7};
  c.migration.enabled = true;
  c.migration.check_every = 2;
  c.migration.patience = 2;
  c.migration.threshold = 0.5;  // a tiny model on a shared machine: only a gross imbalance
  auto planned = plan_auto_partition(c);
  REQUIRE_MESSAGE(planned.ok(), (planned.ok() ? "" : planned.error().message));
  const std::vector<int> want = planned->result.ranked.front().layers_per_stage;
  REQUIRE(want != std::vector<int>{1, 7});

  auto e = engine(c);  // reads the profile plan_auto_partition cached
  auto data = config_loader(c);
  std::vector<MigrationEvent> events;
  // 6 steps: checks after 2 (imbalanced, waiting), 4 (decides to move: the run is cut short
  // after the step in flight, 4 or 5, and the move made there) and 6 (one check after it: with
  // patience 2 no second move can follow, whatever a loaded machine measures)
  const auto losses = run_engine(*e, *data, {6}, &events);
  REQUIRE(events.size() == 3);   // a check every 2 steps
  CHECK_FALSE(events[0].moved);  // the first imbalanced check waits for patience
  CHECK(events[0].imbalance > 0.5);
  CHECK(events[0].reason.find("check 1 of 2") != std::string::npos);
  CHECK(events[1].moved);
  CHECK(events[1].decided == 4);
  CHECK(events[1].step >= 4);
  CHECK(events[1].step <= 5);
  CHECK(events[2].step == 6);
  CHECK(events[1].to == want);
  CHECK(events[1].predicted_new < events[1].predicted_now);
  int moves = 0;
  for (const MigrationEvent& ev : events) {
    MESSAGE("step ", ev.step, ": ", ev.reason);
    moves += ev.moved ? 1 : 0;
  }
  CHECK(moves == 1);
  CHECK(e->config().pipeline.partition.counts == want);
  // 1f1b is synchronous: the serial executor of any partition computes the same bits
  Config plain = c;
  plain.migration.enabled = false;
  auto serial = SerialExecutor::create(plain);
  REQUIRE(serial.ok());
  auto data_s = config_loader(plain);
  auto ls = (*serial)->run(6, *data_s);
  REQUIRE(ls.ok());
  CHECK(same_bits(losses, *ls));
  check_same_state(*e, **serial, 8);
  if (old) {
    ::setenv("ACTORPIPE_CACHE_DIR", saved.c_str(), 1);
  } else {
    ::unsetenv("ACTORPIPE_CACHE_DIR");
  }
}

TEST_CASE("checks that do not move leave every mode's run as it is without the manager") {
  // the checks run while the pipeline does: no segment ends at them, so pipedream and xpipe do
  // not drain there and 2bw does not refill (checks used to end segments)
  TempDir cache;
  const char* old = std::getenv("ACTORPIPE_CACHE_DIR");
  const std::string saved = old ? old : "";
  ::setenv("ACTORPIPE_CACHE_DIR", cache.path.c_str(), 1);
  for (const char* mode : {"1f1b", "2bw", "pipedream", "xpipe"}) {
    const std::string what = mode;
    CAPTURE(what);
    Config plain = six_layers(Arch::gpt, mode, 2, {3, 3});
    Config checked = plain;
    checked.migration.enabled = true;
    checked.migration.check_every = 1;
    checked.migration.threshold = 1e6;  // never imbalanced: every check says "balanced"
    auto a = engine(plain);
    auto b = engine(checked);
    auto data_a = config_loader(plain), data_b = config_loader(checked);
    std::vector<MigrationEvent> events;
    const auto la = run_engine(*a, *data_a, {7});
    const auto lb = run_engine(*b, *data_b, {7}, &events);
    CHECK(same_bits(la, lb));
    check_same_state(*a, *b, 6);
    CHECK(data_a->position() == data_b->position());
    // a verdict for every step after the first (a check needs a step in its window), none moved
    CHECK(events.size() >= 5);
    for (const MigrationEvent& e : events) {
      CHECK_FALSE(e.moved);
      CHECK(e.reason.rfind("balanced", 0) == 0);
    }
  }
  if (old) {
    ::setenv("ACTORPIPE_CACHE_DIR", saved.c_str(), 1);
  } else {
    ::unsetenv("ACTORPIPE_CACHE_DIR");
  }
}
