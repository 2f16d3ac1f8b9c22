// Serial executor tests: gpipe and 1f1b over every d ≤ 4 and m ≤ 8 equal the single-stage
// reference trainer bitwise (GPT and BERT, clipping on), runs are deterministic with any thread
// counts, lowered and compute-only schedules agree, consecutive runs continue exactly (2bw too),
// and bad inputs are refused.
#include "engine/execution/serial_executor.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "engine/data/loader.hpp"
#include "engine/execution/reference_trainer.hpp"
#include "engine/schedule/generators.hpp"
#include "kernels/check.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

ModelOptions tiny(Arch arch, bool tied = true) {
  return tiny_model(arch, tied, 11);
}

std::vector<Microbatch> batches(Arch arch, int V, int n, uint64_t seed = 7) {
  return tiny_batches(arch, V, n, seed);
}

struct Reference {
  std::vector<std::vector<float>> params;
  std::vector<double> losses;
  std::vector<double> norms;
};

Reference reference_run(const Model& model, const OptimizerOptions& opt,
                        const std::vector<Microbatch>& mbs, int m, int steps) {
  ReferenceTrainer ref(model, opt, kB, kT, 1);
  Reference out;
  for (int s = 0; s < steps; ++s) {
    std::span<const Microbatch> step(mbs.data() + static_cast<size_t>(s) * m,
                                     static_cast<size_t>(m));
    out.losses.push_back(ref.step(step));
    out.norms.push_back(ref.last_grad_norm());
  }
  for (int i = 0; i < model.num_layers(); ++i)
    out.params.emplace_back(ref.params(i).begin(), ref.params(i).end());
  return out;
}

std::unique_ptr<SerialExecutor> executor(const Model& model, const Partition& p,
                                         const OptimizerOptions& opt, Mode mode, int m,
                                         std::vector<int> threads = {}, bool lowered = true) {
  SerialExecutorOptions o;
  o.mode = mode;
  o.microbatches = m;
  o.B = kB;
  o.T = kT;
  o.threads = std::move(threads);
  o.lowered = lowered;
  auto e = SerialExecutor::create(model, p, opt, o);
  REQUIRE_MESSAGE(e.ok(), (e.ok() ? "" : e.error().message));
  return std::move(e).value();
}

// Every layer of the executor equals the reference bit for bit.
void check_params(const SerialExecutor& e, const Reference& ref) {
  for (int i = 0; i < e.model().num_layers(); ++i) {
    INFO("layer " << i);
    CHECK(same_bits(e.params(i), ref.params[static_cast<size_t>(i)]));
  }
}

}  // namespace

TEST_CASE("gpipe and 1f1b equal the reference trainer bitwise for d <= 4, m <= 8") {
  constexpr int kSteps = 3;
  const OptimizerOptions opt = clipped_adamw();
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    const Model model = build_model(tiny(arch));
    for (int m = 1; m <= 8; ++m) {
      const auto mbs = batches(arch, model.options().vocab_size, m * kSteps);
      const Reference ref = reference_run(model, opt, mbs, m, kSteps);
      for (double n : ref.norms) REQUIRE(n > opt.grad_clip);  // clipping is exercised
      for (int d = 1; d <= 4; ++d) {
        const Partition p = *Partition::even(model.num_layers(), d);
        for (Mode mode : {Mode::gpipe, Mode::onef1b}) {
          INFO((arch == Arch::gpt ? "gpt" : "bert")
               << " m=" << m << " d=" << d << " " << to_string(mode));
          auto e = executor(model, p, opt, mode, m);
          auto losses = e->run(kSteps, mbs);
          REQUIRE_MESSAGE(losses.ok(), (losses.ok() ? "" : losses.error().message));
          CHECK(*losses == ref.losses);
          check_params(*e, ref);
          CHECK(e->microbatches_done() == m * kSteps);
        }
      }
    }
  }
}

TEST_CASE("sync modes: untied, SGD with warm-up, uneven partitions and compute-only schedules") {
  constexpr int kSteps = 4, m = 3;
  OptimizerOptions sgd = clipped_sgd();
  sgd.grad_clip = 0.5f;
  sgd.warmup_steps = 3;
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (bool tied : {false, true}) {
      for (const OptimizerOptions& opt : {clipped_adamw(), sgd}) {
        const Model model = build_model(tiny(arch, tied));
        const auto mbs = batches(arch, model.options().vocab_size, m * kSteps, 99);
        const Reference ref = reference_run(model, opt, mbs, m, kSteps);
        for (const std::vector<int>& counts :
             {std::vector<int>{1, 3}, std::vector<int>{3, 1}, std::vector<int>{2, 1, 1}}) {
          const Partition p = *Partition::from_counts(model.num_layers(), counts);
          for (bool lowered : {true, false}) {
            INFO("tied " << tied << " " << opt.kind << " " << p.to_string() << " lowered "
                         << lowered);
            auto e = executor(model, p, opt, Mode::onef1b, m, {}, lowered);
            auto losses = e->run(kSteps, mbs);
            REQUIRE(losses.ok());
            CHECK(*losses == ref.losses);
            check_params(*e, ref);
          }
        }
      }
    }
  }
}

TEST_CASE("runs are deterministic with different thread counts per stage") {
  constexpr int m = 4;
  const OptimizerOptions opt = clipped_adamw();
  for (Mode mode : all_modes) {
    const Model model = build_model(tiny(Arch::gpt));
    const Partition p = *Partition::even(model.num_layers(), 3);
    const int steps = 3;
    auto run_once = [&](std::vector<int> threads) {
      auto e = executor(model, p, opt, mode, m, std::move(threads));
      const auto mbs = batches(Arch::gpt, model.options().vocab_size,
                               static_cast<int>(e->microbatches_for(steps)), 5);
      auto losses = e->run(steps, mbs);
      REQUIRE_MESSAGE(losses.ok(), (losses.ok() ? "" : losses.error().message));
      std::vector<std::vector<float>> out;
      for (int i = 0; i < model.num_layers(); ++i)
        out.emplace_back(e->params(i).begin(), e->params(i).end());
      return std::pair{*losses, out};
    };
    INFO(to_string(mode));
    const auto a = run_once({1, 2, 3});
    const auto b = run_once({1, 2, 3});
    const auto c = run_once({3, 1, 2});
    const auto d = run_once({3, 1, 2});
    CHECK(a.first == b.first);
    CHECK(a.second == b.second);
    CHECK(c.first == d.first);
    CHECK(c.second == d.second);
    // and the weights moved
    const Model fresh = build_model(tiny(Arch::gpt));
    std::vector<float> init(fresh.layer(1).param_floats());
    fresh.init_layer(1, init.data());
    CHECK(a.second[1] != init);
  }
}

TEST_CASE("consecutive runs continue training: two runs of 2 steps equal one run of 4") {
  constexpr int m = 2;
  const OptimizerOptions opt = clipped_adamw();
  const Model model = build_model(tiny(Arch::gpt));
  const Partition p = *Partition::even(model.num_layers(), 2);
  const auto mbs = batches(Arch::gpt, model.options().vocab_size, 4 * m);
  auto one = executor(model, p, opt, Mode::gpipe, m);
  REQUIRE(one->run(4, mbs).ok());
  auto two = executor(model, p, opt, Mode::gpipe, m);
  REQUIRE(two->run(2, std::span(mbs).first(2 * m)).ok());
  REQUIRE(two->run(2, std::span(mbs).subspan(2 * m)).ok());
  for (int i = 0; i < model.num_layers(); ++i) CHECK(same_bits(one->params(i), two->params(i)));
  CHECK(two->worker(0).updates() == 4);
}

TEST_CASE("each step is reported once every stage committed its update, also inside a long run") {
  // every mode, 3 stages: step k's callback comes when the slowest stage has made its k-th update
  // (so before the run ends in the asynchronous modes, whose run is one schedule) with the loss
  // the run returns for it
  const OptimizerOptions opt = clipped_adamw();
  const Model model = build_model(tiny(Arch::gpt));
  const Partition p = *Partition::even(model.num_layers(), 3);
  for (Mode mode : all_modes) {
    INFO(to_string(mode));
    const int m = mode == Mode::pipedream ? 1 : 3, steps = mode == Mode::pipedream ? 7 : 4;
    auto e = executor(model, p, opt, mode, m);
    const auto mbs = batches(Arch::gpt, model.options().vocab_size,
                             static_cast<int>(e->microbatches_for(2 * steps)));
    for (int run = 0; run < 2; ++run) {  // the second run counts from 1 again
      std::vector<double> reported;
      auto losses = e->run(steps,
                           std::span(mbs).subspan(static_cast<size_t>(run * steps * m),
                                                  static_cast<size_t>(steps * m)),
                           [&](int step, double loss) {
                             CHECK(step == static_cast<int>(reported.size()) + 1);
                             long slowest = e->worker(0).updates();
                             for (int r = 1; r < 3; ++r)
                               slowest = std::min(slowest, e->worker(r).updates());
                             CHECK(slowest == run * steps + step);
                             reported.push_back(loss);
                           });
      REQUIRE(losses.ok());
      CHECK(same_bits(reported, *losses));
    }
  }
}

TEST_CASE("2bw: runs of 1, 2 and 3 steps equal one run of 6 bitwise (the runs continue)") {
  const OptimizerOptions opt = clipped_adamw();
  for (int d : {2, 3}) {
    for (bool tied : {true, false}) {
      CAPTURE(d);
      CAPTURE(tied);
      const int m = d + 1;
      const Model model = build_model(tiny(Arch::gpt, tied));
      const Partition p = *Partition::even(model.num_layers(), d);
      const auto mbs = batches(Arch::gpt, model.options().vocab_size, 6 * m);
      auto one = executor(model, p, opt, Mode::twobw, m);
      CHECK_FALSE(one->schedules_for(6)->front().continued);  // a fresh training: W(-1) = W(0)
      auto whole = one->run(6, mbs);
      REQUIRE(whole.ok());
      auto split = executor(model, p, opt, Mode::twobw, m);
      std::vector<double> losses;
      int done = 0;
      for (int steps : {1, 2, 3}) {
        CHECK(split->schedules_for(steps)->front().continued == (done > 0));
        auto l = split->run(steps, std::span(mbs).subspan(static_cast<size_t>(done * m),
                                                          static_cast<size_t>(steps * m)));
        REQUIRE_MESSAGE(l.ok(), (l.ok() ? "" : l.error().message));
        losses.insert(losses.end(), l->begin(), l->end());
        done += steps;
        for (int r = 0; r < d; ++r) CHECK(split->worker(r).holds_previous());
      }
      CHECK(std::memcmp(losses.data(), whole->data(), losses.size() * sizeof(double)) == 0);
      for (int i = 0; i < model.num_layers(); ++i)
        CHECK(same_bits(one->params(i), split->params(i)));
      for (int r = 0; r < d; ++r) {
        for (int i = 0; i < split->worker(r).num_layers(); ++i)
          CHECK(same_bits(one->optimizer(r).state(i), split->optimizer(r).state(i)));
      }
      CHECK(split->worker(0).updates() == 6);
    }
  }
}

TEST_CASE("the executor refuses bad input with errors that name it") {
  const Model model = build_model(tiny(Arch::gpt));
  const Partition p2 = *Partition::even(model.num_layers(), 2);
  const OptimizerOptions opt = clipped_adamw();
  auto message = [&](const SerialExecutorOptions& o) {
    auto e = SerialExecutor::create(model, p2, opt, o);
    return e.ok() ? std::string() : e.error().message;
  };
  SerialExecutorOptions o;
  o.B = kB;
  o.T = kT;
  o.microbatches = 0;
  CHECK(message(o).find("microbatches = 0") != std::string::npos);
  o.microbatches = 2;
  o.T = 9;
  CHECK(message(o).find("seq_len = 9") != std::string::npos);
  o.T = kT;
  o.threads = {1};
  CHECK(message(o).find("threads: 1 entries for 2 stages") != std::string::npos);
  o.threads = {};
  o.mode = Mode::twobw;
  o.microbatches = 1;
  CHECK(message(o).find("2bw needs microbatches >= stages") != std::string::npos);

  o.mode = Mode::onef1b;
  o.microbatches = 2;
  auto e = SerialExecutor::create(model, p2, opt, o);
  REQUIRE(e.ok());
  const auto mbs = batches(Arch::gpt, model.options().vocab_size, 4);
  auto wrong_count = (*e)->run(2, std::span(mbs).first(3));
  REQUIRE_FALSE(wrong_count.ok());
  CHECK(wrong_count.error().message.find("read 4 microbatches, got 3") != std::string::npos);
  // a schedule of another mode, and a broken schedule
  auto other = make_gpipe(2, 2);
  auto r = (*e)->run_schedule(*other, std::span(mbs).first(2));
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("gpipe schedule of 2 stages given to a 1f1b executor") !=
        std::string::npos);
  auto broken = *make_1f1b(2, 2);
  broken.per_stage[1].erase(broken.per_stage[1].begin());  // drop 1F0
  r = (*e)->run_schedule(broken, std::span(mbs).first(2));
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("ERROR HERE") != std::string::npos);
}

TEST_CASE("create from a config and read the configured data") {
  Config c = tiny_config("2bw", 2, 2, tiny(Arch::gpt));
  c.pipeline.partition.counts = {3, 1};
  c.optimizer = clipped_adamw();
  c.data.seed = 7;
  auto e = SerialExecutor::create(c, true);
  REQUIRE_MESSAGE(e.ok(), (e.ok() ? "" : e.error().message));
  CHECK((*e)->partition().counts() == std::vector<int>{3, 1});
  CHECK((*e)->options().mode == Mode::twobw);
  auto data = DataLoader::open(c.data, Arch::gpt, c.model.vocab_size, kB, kT);
  REQUIRE(data.ok());
  auto losses = (*e)->run(3, **data);
  REQUIRE(losses.ok());
  CHECK(losses->size() == 3);
  CHECK((*data)->position() == 6);
  CHECK((*e)->version_log().size() == 2 * 2 * 6);

  // the same run from explicit parts
  const Model model = build_model(c.model);
  auto same = executor(model, *Partition::from_counts(4, std::vector<int>{3, 1}), c.optimizer,
                       Mode::twobw, 2);
  auto same_losses = same->run(3, batches(Arch::gpt, c.model.vocab_size, 6, 7));
  REQUIRE(same_losses.ok());
  CHECK(*same_losses == *losses);
  for (int i = 0; i < model.num_layers(); ++i) CHECK(same_bits(same->params(i), (*e)->params(i)));

  c.pipeline.mode = "zero-bubble";
  CHECK(SerialExecutor::create(c).error().message.find("pipeline.mode") != std::string::npos);
  c.pipeline.mode = "1f1b";
  c.pipeline.partition.counts = {2, 1};
  CHECK(SerialExecutor::create(c).error().message.find(
            "pipeline.partition = [2, 1]: sums to 3 but the model has 4 layers") !=
        std::string::npos);
}

TEST_CASE("recompute none, all and a list give the same bits in every mode (tied, clipped)") {
  struct Case {
    const char* mode;
    int d, m, steps;
  };
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (const Case c : {Case{"gpipe", 2, 3, 2}, Case{"1f1b", 3, 4, 2}, Case{"2bw", 3, 3, 4},
                         Case{"pipedream", 4, 2, 5}, Case{"xpipe", 3, 2, 3}}) {
      CAPTURE(c.mode);
      CAPTURE((arch == Arch::gpt ? "gpt" : "bert"));
      Config base = tiny_config(c.mode, c.d, c.m, tiny(arch));
      base.optimizer = clipped_adamw();
      base.data.seed = 5;
      auto run = [&](const RecomputeSpec& spec) {
        Config cfg = base;
        cfg.pipeline.recompute = spec;
        auto e = SerialExecutor::create(cfg, true);
        REQUIRE_MESSAGE(e.ok(), (e.ok() ? "" : e.error().message));
        auto data = config_loader(cfg);
        auto losses = (*e)->run(c.steps, *data);
        REQUIRE_MESSAGE(losses.ok(), (losses.ok() ? "" : losses.error().message));
        std::vector<std::vector<float>> params;
        for (int i = 0; i < (*e)->model().num_layers(); ++i)
          params.emplace_back((*e)->params(i).begin(), (*e)->params(i).end());
        size_t stash = 0;
        for (int r = 0; r < (*e)->stages(); ++r) stash += (*e)->worker(r).stash_bytes();
        return std::make_tuple(*losses, params, stash);
      };
      const auto [losses, params, stash] = run({});
      for (const RecomputeSpec& r : {RecomputeSpec{RecomputeSpec::Kind::all, {}},
                                     RecomputeSpec{RecomputeSpec::Kind::layers, {3, 1}},
                                     RecomputeSpec{RecomputeSpec::Kind::layers, {}}}) {
        CAPTURE(r.layers.size());
        const auto [l2, p2, s2] = run(r);
        CHECK(same_bits(l2, losses));
        REQUIRE(p2.size() == params.size());
        for (size_t i = 0; i < params.size(); ++i) CHECK(same_bits(p2[i], params[i]));
        if (r.kind == RecomputeSpec::Kind::layers && r.layers.empty()) {
          CHECK(s2 == stash);
        } else if (std::string(c.mode) != "xpipe") {
          CHECK(s2 < stash);  // (xpipe keeps the weights of its forwards instead)
        }
      }
    }
  }
}

TEST_CASE("recompute flags from a config: bad layers and an unresolved auto are errors") {
  Config c = tiny_config("1f1b", 2, 2, tiny(Arch::gpt));
  c.pipeline.recompute = {RecomputeSpec::Kind::layers, {1, 4}};
  auto e = SerialExecutor::create(c);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message ==
        "pipeline.recompute = [1, 4]: layer 4 is outside the model's layers 0 .. 3");
  c.pipeline.recompute = {RecomputeSpec::Kind::layers, {2, 2}};
  CHECK(SerialExecutor::create(c).error().message ==
        "pipeline.recompute = [2, 2]: layer 2 is listed twice");
  c.pipeline.recompute = {RecomputeSpec::Kind::automatic, {}};
  CHECK(SerialExecutor::create(c).error().message.find(
            "pipeline.recompute = \"auto\": the planner chooses the layers") != std::string::npos);
  // flags of a model of another size
  const Model model = build_model(tiny(Arch::gpt));
  SerialExecutorOptions o;
  o.recompute = {true, false};
  auto bad = SerialExecutor::create(model, *Partition::even(4, 2), c.optimizer, o);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message == "recompute: 2 flags for a model of 4 layers");
}

TEST_CASE("a stop cuts an asynchronous run after the steps stage 0 has begun (first_steps)") {
  for (const char* mode : {"2bw", "pipedream", "xpipe"}) {
    CAPTURE(mode);
    Config c = tiny_config(mode, 3, 3, tiny(Arch::gpt));
    c.optimizer = clipped_adamw();
    c.data.seed = 9;
    constexpr int kSteps = 12;
    auto e = SerialExecutor::create(c, true);
    REQUIRE(e.ok());
    auto data = config_loader(c);
    StopFlag stop;
    std::vector<int> reported;
    auto losses = (*e)->run(
        kSteps, *data,
        [&](int step, double) {
          reported.push_back(step);
          if (step == 2) stop.request();
        },
        &stop);
    REQUIRE_MESSAGE(losses.ok(), (losses.ok() ? "" : losses.error().message));
    const int k = static_cast<int>(losses->size());
    // step 2 came once stage 0 had begun a few more (the pipeline holds about d of them)
    CHECK(k >= 2);
    CHECK(k < kSteps);
    CHECK(reported.size() == static_cast<size_t>(k));
    CHECK(static_cast<int64_t>(data->position()) == (*e)->microbatches_for(k));
    CHECK((*e)->microbatches_done() == (*e)->microbatches_for(k));

    // exactly a run of k steps: losses, weights, optimizer state; and the next run goes on alike
    auto ref = SerialExecutor::create(c, true);
    REQUIRE(ref.ok());
    auto ref_data = config_loader(c);
    auto ref_losses = (*ref)->run(k, *ref_data);
    REQUIRE(ref_losses.ok());
    CHECK(same_bits(*losses, *ref_losses));
    for (int i = 0; i < (*e)->model().num_layers(); ++i)
      CHECK(same_bits((*e)->params(i), (*ref)->params(i)));
    for (int r = 0; r < (*e)->stages(); ++r)
      for (int i = 0; i < (*e)->worker(r).num_layers(); ++i)
        CHECK(same_bits((*e)->optimizer(r).state(i), (*ref)->optimizer(r).state(i)));
    auto next = (*e)->run(3, *data);
    auto ref_next = (*ref)->run(3, *ref_data);
    REQUIRE(next.ok());
    REQUIRE(ref_next.ok());
    CHECK(same_bits(*next, *ref_next));
    for (int i = 0; i < (*e)->model().num_layers(); ++i)
      CHECK(same_bits((*e)->params(i), (*ref)->params(i)));
  }
}
