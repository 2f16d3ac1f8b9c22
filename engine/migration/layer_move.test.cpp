// Layer move: every layer's parameters, optimizer state, update count and 2bw previous version
// arrive where the new partition puts them; stages that keep their layers keep their objects;
// a bad move changes nothing. (The bitwise oracles of runs with moves are in actors/.)
#include "engine/migration/layer_move.hpp"

#include <doctest/doctest.h>

#include "engine/execution/optimizer_shard.hpp"
#include "engine/execution/stage_worker.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

struct Stages {
  std::vector<std::unique_ptr<StageWorker>> workers;
  std::vector<std::unique_ptr<OptimizerShard>> shards;
};

// Stages of `part` whose every value names its layer, slot position and kind, at 3 updates;
// with `previous` (2bw) the previous version too.
Stages patterned(const Model& model, const Partition& part, Mode mode,
                 const OptimizerOptions& opt = {}) {
  Stages s;
  for (int r = 0; r < part.stages(); ++r) {
    StageWorkerOptions wo;
    wo.mode = mode;
    wo.stage = r;
    wo.microbatches = 4;
    wo.B = kB;
    wo.T = kT;
    s.workers.push_back(std::make_unique<StageWorker>(model, part, opt, wo));
    s.shards.push_back(std::make_unique<OptimizerShard>(model, part, r, opt));
    StageWorker& w = *s.workers.back();
    w.set_updates(3);
    for (int i = 0; i < w.num_layers(); ++i) {
      const float layer = static_cast<float>(w.first_layer() + i);
      auto p = w.mutable_params(i);
      for (size_t k = 0; k < p.size(); ++k) p[k] = layer * 1000.0f + static_cast<float>(k % 97);
      auto st = s.shards.back()->state(i);
      for (size_t k = 0; k < st.size(); ++k) st[k] = -layer - static_cast<float>(k % 89) / 128;
      if (mode == Mode::twobw) {
        auto prev = w.mutable_previous_params(i);
        for (size_t k = 0; k < prev.size(); ++k) prev[k] = layer + static_cast<float>(k % 7) / 8;
      }
    }
  }
  return s;
}

// Every layer's values as patterned() wrote them, wherever it is now.
void check_patterned(const Stages& s, Mode mode) {
  for (size_t r = 0; r < s.workers.size(); ++r) {
    const StageWorker& w = *s.workers[r];
    CHECK(w.updates() == 3);
    CHECK(w.holds_previous() == (mode == Mode::twobw));
    for (int i = 0; i < w.num_layers(); ++i) {
      const float layer = static_cast<float>(w.first_layer() + i);
      auto p = w.params(i);
      bool params_ok = true, state_ok = true, prev_ok = true;
      for (size_t k = 0; k < p.size(); ++k)
        params_ok = params_ok && p[k] == layer * 1000.0f + static_cast<float>(k % 97);
      auto st = s.shards[r]->state(i);
      for (size_t k = 0; k < st.size(); ++k)
        state_ok = state_ok && st[k] == -layer - static_cast<float>(k % 89) / 128;
      if (mode == Mode::twobw) {
        auto prev = w.params(2, i);
        for (size_t k = 0; k < prev.size(); ++k)
          prev_ok = prev_ok && prev[k] == layer + static_cast<float>(k % 7) / 8;
      }
      CHECK_MESSAGE(params_ok, "layer " << layer);
      CHECK_MESSAGE(state_ok, "layer " << layer);
      CHECK_MESSAGE(prev_ok, "layer " << layer);
    }
  }
}

Partition counts(std::vector<int> c) {
  auto p = Partition::from_counts(4, c);
  REQUIRE(p.ok());
  return *p;
}

}  // namespace

TEST_CASE("a move puts every layer's state where the new partition says, in 1f1b and 2bw") {
  const Model model = build_model(tiny_model(Arch::gpt, false, 5));
  for (Mode mode : {Mode::onef1b, Mode::twobw}) {
    CAPTURE(to_string(mode));
    Stages s = patterned(model, counts({1, 2, 1}), mode);
    const StageWorker* kept = s.workers[2].get();
    auto report = move_layers(counts({1, 2, 1}), counts({2, 1, 1}), s.workers, s.shards);
    REQUIRE_MESSAGE(report.ok(), (report.ok() ? "" : report.error().message));
    CHECK(report->from == std::vector<int>{1, 2, 1});
    CHECK(report->to == std::vector<int>{2, 1, 1});
    CHECK(report->layers_moved == 1);
    CHECK(report->stages_rebuilt == std::vector<int>{0, 1});
    CHECK(s.workers[2].get() == kept);  // stage 2 keeps its layers and its objects
    CHECK(s.workers[2]->partition().counts() == std::vector<int>{2, 1, 1});
    CHECK(s.workers[0]->num_layers() == 2);
    CHECK(s.workers[1]->first_layer() == 2);
    // layer 1 moved: its parameters, AdamW m and v, and in 2bw the previous version
    const int64_t p1 = static_cast<int64_t>(model.layer(1).param_floats()) * 4;
    CHECK(report->bytes_moved == p1 * (mode == Mode::twobw ? 4 : 3));
    CHECK(report->bytes_copied > report->bytes_moved);
    // the rebuilt stages' scratch (stash, backward buffers) is the replaced stages'
    CHECK(report->bytes_reused > 0);
    for (const auto& w : s.workers) CHECK(w->holds_scratch());
    check_patterned(s, mode);
    // and back, over two boundaries at once
    auto back = move_layers(counts({2, 1, 1}), counts({1, 1, 2}), s.workers, s.shards);
    REQUIRE(back.ok());
    CHECK(back->layers_moved == 2);
    CHECK(back->stages_rebuilt == std::vector<int>{0, 1, 2});
    check_patterned(s, mode);
  }
}

TEST_CASE(
    "a move carries the secant correction's state (six floats per parameter) with its layer") {
  const Model model = build_model(tiny_model(Arch::gpt, false, 5));
  OptimizerOptions opt;
  opt.delay_correction = "secant+nesterov";
  Stages s = patterned(model, counts({1, 2, 1}), Mode::twobw, opt);
  CHECK(s.shards[0]->state(0).size() == 6 * model.layer(0).param_floats());
  auto report = move_layers(counts({1, 2, 1}), counts({2, 1, 1}), s.workers, s.shards);
  REQUIRE_MESSAGE(report.ok(), (report.ok() ? "" : report.error().message));
  // layer 1: its parameters, m, v, the four secant arrays and the previous version
  const int64_t p1 = static_cast<int64_t>(model.layer(1).param_floats()) * 4;
  CHECK(report->bytes_moved == p1 * 8);
  check_patterned(s, Mode::twobw);
}

TEST_CASE("a move carries the basis rotation's covariances and eigenvectors with its layer") {
  const Model model = build_model(tiny_model(Arch::gpt, false, 5));
  OptimizerOptions opt;
  opt.basis_rotation = true;
  Stages s = patterned(model, counts({1, 2, 1}), Mode::twobw, opt);
  const Layer& l1 = model.layer(1);
  size_t rotation = 0;  // per matrix slot of layer 1: its two covariances and two bases
  for (const ParamSlot& slot : l1.slots()) {
    if (slot.shape.size() != 2) continue;
    const size_t r = static_cast<size_t>(slot.shape[0]), c = static_cast<size_t>(slot.shape[1]);
    rotation += 2 * (r * r + c * c);
  }
  REQUIRE(rotation > 0);
  CHECK(s.shards[0]->state(0).size() == optimizer_state_floats(opt, model.layer(0)));
  auto report = move_layers(counts({1, 2, 1}), counts({2, 1, 1}), s.workers, s.shards);
  REQUIRE_MESSAGE(report.ok(), (report.ok() ? "" : report.error().message));
  // layer 1: its parameters, m, v, the rotation's matrices and the previous version
  const int64_t p1 = static_cast<int64_t>(l1.param_floats()) * 4;
  CHECK(report->bytes_moved == p1 * 4 + static_cast<int64_t>(rotation) * 4);
  check_patterned(s, Mode::twobw);
}

TEST_CASE("a move that cannot be made changes nothing and says why") {
  const Model model = build_model(tiny_model(Arch::gpt, false, 5));
  Stages s = patterned(model, counts({2, 2}), Mode::onef1b);
  const StageWorker* w0 = s.workers[0].get();
  auto wrong = move_layers(counts({2, 2}), counts({1, 2, 1}), s.workers, s.shards);
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.error().message.find("a move from 2 stages over 4 layers to 3 stages") !=
        std::string::npos);
  // stages at different update counts (one of them behind): refused by the state mapping
  s.workers[1]->set_updates(2);
  auto behind = move_layers(counts({2, 2}), counts({1, 3}), s.workers, s.shards);
  REQUIRE_FALSE(behind.ok());
  CHECK(behind.error().message.find("migration: ") == 0);
  CHECK(s.workers[0].get() == w0);
  CHECK(s.workers[0]->num_layers() == 2);
  s.workers[1]->set_updates(3);
  check_patterned(s, Mode::onef1b);
  // no change: nothing rebuilt
  auto same = move_layers(counts({2, 2}), counts({2, 2}), s.workers, s.shards);
  REQUIRE(same.ok());
  CHECK(same->stages_rebuilt.empty());
  CHECK(same->bytes_moved == 0);
  CHECK(s.workers[0].get() == w0);
}

TEST_CASE("a move built but not installed hands the scratch back to the stages it would replace") {
  const Model model = build_model(tiny_model(Arch::gpt, false, 5));
  for (Mode mode : {Mode::onef1b, Mode::twobw}) {
    CAPTURE(to_string(mode));
    Stages s = patterned(model, counts({1, 2, 1}), mode);
    std::vector<size_t> stash;
    for (const auto& w : s.workers) stash.push_back(w->stash_bytes());
    const Partition from = counts({1, 2, 1}), to = counts({2, 1, 1});
    auto check_handed_back = [&] {
      for (size_t r = 0; r < s.workers.size(); ++r) {
        CHECK(s.workers[r]->holds_scratch());
        CHECK(s.workers[r]->stash_bytes() >= stash[r]);
      }
      check_patterned(s, mode);
    };
    // built and loaded, then dropped (another process failed): the old stages take theirs back
    {
      auto state = rebuilt_state(from, to, s.workers, s.shards);
      REQUIRE(state.ok());
      auto built = build_rebuilt_stages(from, to, std::move(*state), s.workers, s.shards);
      REQUIRE(built.ok());
      CHECK(built->scratch.bytes_reused() > 0);
      CHECK_FALSE(s.workers[0]->holds_scratch());  // lent to the rebuilt stage 0
      CHECK(s.workers[2]->holds_scratch());        // kept its range: lends nothing
    }
    check_handed_back();
    // a load that fails (a tensor missing) hands it back before returning the error
    auto state = rebuilt_state(from, to, s.workers, s.shards);
    REQUIRE(state.ok());
    state->model.pop_back();
    auto failed = build_rebuilt_stages(from, to, std::move(*state), s.workers, s.shards);
    REQUIRE_FALSE(failed.ok());
    CHECK(failed.error().message.find("installing the moved state") != std::string::npos);
    check_handed_back();
    // and the stages can still move
    auto report = move_layers(from, to, s.workers, s.shards);
    REQUIRE(report.ok());
    check_patterned(s, mode);
  }
}

TEST_CASE("the three phases of a move, in two 'processes' with the state routed between them") {
  const Model model = build_model(tiny_model(Arch::gpt, false, 5));
  // stages 0 and 1 in process 0, stage 2 in process 1
  const std::vector<int> rank_of = {0, 0, 1};
  for (Mode mode : {Mode::onef1b, Mode::twobw}) {
    CAPTURE(to_string(mode));
    Stages s = patterned(model, counts({1, 2, 1}), mode);
    const StageWorker* kept = s.workers[0].get();
    auto move = [&](const Partition& from, const Partition& to) {
      // each process holds only its stages
      std::vector<Stages> procs(2);
      for (auto& p : procs) {
        p.workers.resize(3);
        p.shards.resize(3);
      }
      for (size_t r = 0; r < 3; ++r) {
        procs[static_cast<size_t>(rank_of[r])].workers[r] = std::move(s.workers[r]);
        procs[static_cast<size_t>(rank_of[r])].shards[r] = std::move(s.shards[r]);
      }
      // phase 1 in each; every tensor goes to the process of its layer's new stage
      std::vector<CheckpointContents> inbox(2);
      for (size_t p = 0; p < 2; ++p) {
        auto state = rebuilt_state(from, to, procs[p].workers, procs[p].shards);
        REQUIRE_MESSAGE(state.ok(), (state.ok() ? "" : state.error().message));
        for (auto* group : {&state->model, &state->optimizer, &state->versions}) {
          for (NamedTensor& t : *group) {
            const int layer = checkpoint_layer(t.name);
            REQUIRE(layer >= 0);
            CheckpointContents& dst =
                inbox[static_cast<size_t>(rank_of[static_cast<size_t>(to.stage_of(layer))])];
            auto& into = group == &state->model       ? dst.model
                         : group == &state->optimizer ? dst.optimizer
                                                      : dst.versions;
            into.push_back(std::move(t));
          }
        }
      }
      // phases 2 and 3 in each, with the manifest's update count of its own stages
      for (size_t p = 0; p < 2; ++p) {
        inbox[p].info.model = model.options();
        inbox[p].info.extra["updates"] = std::to_string(3);  // patterned()'s count
        auto built = build_rebuilt_stages(from, to, inbox[p], procs[p].workers, procs[p].shards);
        REQUIRE_MESSAGE(built.ok(), (built.ok() ? "" : built.error().message));
        install_rebuilt_stages(std::move(*built), to, procs[p].workers, procs[p].shards);
      }
      for (size_t r = 0; r < 3; ++r) {
        s.workers[r] = std::move(procs[static_cast<size_t>(rank_of[r])].workers[r]);
        s.shards[r] = std::move(procs[static_cast<size_t>(rank_of[r])].shards[r]);
      }
    };
    // layer 2 crosses from process 0 to process 1; stage 0 keeps its objects
    move(counts({1, 2, 1}), counts({1, 1, 2}));
    CHECK(s.workers[0].get() == kept);
    CHECK(s.workers[0]->partition().counts() == std::vector<int>{1, 1, 2});
    CHECK(s.workers[2]->first_layer() == 2);
    check_patterned(s, mode);
    // and back over two boundaries: layer 2 to process 0, layer 1 within process 0
    move(counts({1, 1, 2}), counts({2, 1, 1}));
    CHECK(s.workers[0]->num_layers() == 2);
    CHECK(s.workers[1]->first_layer() == 2);
    check_patterned(s, mode);
  }
}

TEST_CASE("checkpoint names name their layer") {
  CHECK(checkpoint_layer("layers.0.wte") == 0);
  CHECK(checkpoint_layer("layers.12.attn.qkv.weight@v3") == 12);
  CHECK(checkpoint_layer("layers.7.ln.bias.adam_m") == 7);
  CHECK(checkpoint_layer("layers..x") == -1);
  CHECK(checkpoint_layer("layers.") == -1);
  CHECK(checkpoint_layer("layers.1x.w") == -1);
  CHECK(checkpoint_layer("head.w") == -1);
  CHECK(checkpoint_layer("layers.99999999999.w") == -1);
}
