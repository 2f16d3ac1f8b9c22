// OptimizerShard tests: run_update equals the reference trainer's per-layer optimizer_update
// bitwise (AdamW and SGD, several steps, clip scales), the tied copy's slot takes its own scale
// or is left alone as its rule says, the gradients are consumed, the state layout.
#include "engine/execution/optimizer_shard.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "engine/execution/layer_optimizer.hpp"
#include "engine/execution/stage_worker.hpp"
#include "engine/rng.hpp"
#include "engine/schedule/generators.hpp"
#include "kernels/check.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

Model tiny_gpt() {
  return build_model(tiny_model(Arch::gpt, true, 11));
}

OptimizerOptions optimizer(const char* kind) {
  OptimizerOptions o;
  o.kind = kind;
  o.lr = 3e-2f;
  o.weight_decay = 0.1f;
  o.momentum = 0.9f;
  o.warmup_steps = 3;
  return o;
}

// Stage `stage` of a 2-stage tied GPT in `mode`: `steps` updates with made-up gradients, each
// checked against optimizer_update on copies of the parameters, gradients and state.
void check_updates(Mode mode, int stage, const char* kind, int steps) {
  const Model model = tiny_gpt();
  const Partition p = *Partition::even(model.num_layers(), 2);
  const OptimizerOptions o = optimizer(kind);
  StageWorkerOptions wo;
  wo.mode = mode;
  wo.stage = stage;
  wo.microbatches = 2;
  StageWorker w(model, p, o, wo);
  OptimizerShard shard(model, p, stage, o);
  REQUIRE(shard.num_layers() == w.num_layers());
  for (int i = 0; i < shard.num_layers(); ++i) {
    CHECK(shard.state(i).size() == optimizer_state_floats(o, w.params(i).size()));
    CHECK(
        std::all_of(shard.state(i).begin(), shard.state(i).end(), [](float x) { return x == 0; }));
  }
  const bool copy_stage = w.tied_role(0) == TiedRole::copy;
  const ParamSlot* tied_slot = model.layer(model.num_layers() - 1).find_slot("lm_head.weight");
  const UpdateScales scales{0.75f, 0.5f};
  Context ctx(1);
  NormalRng rng(99);
  for (int step = 1; step <= steps; ++step) {
    CAPTURE(step);
    // one-step schedules: each update is its own run, whose first update produces version 1
    const Schedule s = *make_schedule(mode, 2, 2, 1);
    REQUIRE(w.start_run(s, 0).ok());
    std::vector<std::vector<float>> newest;
    for (int i = 0; i < w.num_layers(); ++i)
      newest.emplace_back(w.params(i).begin(), w.params(i).end());
    const Action opt{stage, ActionKind::OPT_STEP, -1, 1, 0};
    UpdateJob& job = w.begin_update(opt);
    CHECK(job.step() == step);
    std::vector<std::vector<float>> params, grads, state;
    for (int i = 0; i < job.num_layers(); ++i) {
      for (float& g : job.grads(i)) g = static_cast<float>(rng.next());
      CHECK(same_bits(job.params(i), newest[static_cast<size_t>(i)]));  // the newest version
      params.emplace_back(job.params(i).begin(), job.params(i).end());
      grads.emplace_back(job.grads(i).begin(), job.grads(i).end());
      state.emplace_back(shard.state(i).begin(), shard.state(i).end());
    }
    job.finish_gradients(ctx);
    shard.run_update(ctx, job, scales);
    std::vector<std::vector<float>> want;
    for (int i = 0; i < job.num_layers(); ++i) {
      CAPTURE(i);
      const size_t k = static_cast<size_t>(i);
      const Layer& layer = model.layer(w.first_layer() + i);
      std::vector<float> want_p = params[k], want_s = state[k];
      optimizer_update(ctx, o, layer, want_p.data(), grads[k].data(), want_s.data(), step,
                       scales.stage);
      const bool has_tied = copy_stage && layer.find_slot("lm_head.weight") != nullptr;
      if (has_tied) {
        // the copy's slot: scaled by `tied` (exchange_grads) or not updated (follow_owner)
        std::vector<float> tied_p = params[k], tied_s = state[k];
        if (mode != Mode::twobw) {
          optimizer_update(ctx, o, layer, tied_p.data(), grads[k].data(), tied_s.data(), step,
                           scales.tied);
        }
        const size_t n = layer.param_floats();
        for (size_t part = 0; part < want_s.size() / n; ++part) {
          std::copy_n(tied_s.begin() + static_cast<std::ptrdiff_t>(part * n + tied_slot->offset),
                      tied_slot->numel,
                      want_s.begin() + static_cast<std::ptrdiff_t>(part * n + tied_slot->offset));
        }
        std::copy_n(tied_p.begin() + static_cast<std::ptrdiff_t>(tied_slot->offset),
                    tied_slot->numel,
                    want_p.begin() + static_cast<std::ptrdiff_t>(tied_slot->offset));
      }
      CHECK(same_bits(job.params(i), want_p));
      CHECK(same_bits(shard.state(i), want_s));
      CHECK(std::all_of(job.grads(i).begin(), job.grads(i).end(), [](float g) { return g == 0; }));
      want.push_back(std::move(want_p));
    }
    w.commit_update(job);
    CHECK(w.updates() == step);
    if (mode == Mode::twobw && copy_stage) {
      // a follow_owner copy starts the next run from the owner's version: here its own values
      const Layer& head = model.layer(model.num_layers() - 1);
      const std::span<const float> p_head = w.params(w.num_layers() - 1);
      REQUIRE(head.find_slot("lm_head.weight") == tied_slot);
      const std::vector<float> own(
          p_head.begin() + static_cast<std::ptrdiff_t>(tied_slot->offset),
          p_head.begin() + static_cast<std::ptrdiff_t>(tied_slot->offset + tied_slot->numel));
      w.install_tied_weights(0, step, own);
    }
    for (int i = 0; i < w.num_layers(); ++i)
      CHECK(same_bits(w.params(i), want[static_cast<size_t>(i)]));
  }
}

}  // namespace

TEST_CASE("run_update equals optimizer_update layer by layer, bitwise") {
  for (const char* kind : {"adamw", "sgd"}) {
    CAPTURE(kind);
    check_updates(Mode::onef1b, 0, kind, 4);  // the tied owner: every slot takes `stage`
    check_updates(Mode::onef1b, 1, kind, 4);  // exchange_grads copy: its slot takes `tied`
    check_updates(Mode::twobw, 1, kind, 4);   // follow_owner copy: its slot is not updated
  }
}

TEST_CASE("an update of another stage or out of protocol order is refused") {
  const Model model = tiny_gpt();
  const Partition p = *Partition::even(model.num_layers(), 2);
  const OptimizerOptions o = optimizer("adamw");
  StageWorkerOptions wo;
  wo.mode = Mode::gpipe;
  wo.stage = 0;
  StageWorker w(model, p, o, wo);
  OptimizerShard mine(model, p, 0, o), other(model, p, 1, o);
  Context ctx(1);
  REQUIRE(w.start_run(*make_gpipe(2, 1), 0).ok());
  UpdateJob& job = w.begin_update({0, ActionKind::OPT_STEP, -1, 1, 0});
  CHECK_THROWS_AS(mine.run_update(ctx, job, {}), CheckFailure);  // gradients not finished
  job.finish_gradients(ctx);
  CHECK_THROWS_AS(other.run_update(ctx, job, {}), CheckFailure);
  mine.run_update(ctx, job, {});
  CHECK_THROWS_AS(mine.run_update(ctx, job, {}), CheckFailure);
  w.commit_update(job);
  CHECK_THROWS_AS(mine.run_update(ctx, job, {}), CheckFailure);  // no longer open
  CHECK_THROWS_AS(OptimizerShard(model, p, 2, o), CheckFailure);
}
