// Replicated executor tests: w = 2 replicas of gpipe, 1f1b and 2bw pipelines (d = 1, 2; GPT and
// BERT) end with the same bits in every replica, repeat bitwise, stay within 1e-5 (relative, per
// layer, in norm) of one pipeline over the same global batch, continue exactly across runs, and
// refuse what they cannot run.
#include "engine/execution/replicated_executor.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/data/loader.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

Config tiny(Arch arch, const std::string& mode, int d, int m, int w) {
  Config c = tiny_config(mode, d, m, tiny_model(arch, true, 5));
  c.optimizer = clipped_adamw();
  c.data.seed = 3;
  c.pipeline.replicas = w;
  return c;
}

std::unique_ptr<ReplicatedExecutor> make(const Config& c) {
  auto e = ReplicatedExecutor::create(c);
  REQUIRE_MESSAGE(e.ok(), (e.ok() ? "" : e.error().message));
  return std::move(e).value();
}

// ‖a - b‖ / ‖b‖ (in double; 0 for two zero vectors)
double relative_difference(std::span<const float> a, std::span<const float> b) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

}  // namespace

TEST_CASE("two replicas agree bitwise, repeat, and stay within 1e-5 of one pipeline") {
  constexpr int kSteps = 4;
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (const char* mode : {"gpipe", "1f1b", "2bw"}) {
      for (int d : {1, 2}) {
        const int m = 4;
        INFO((arch == Arch::gpt ? "gpt " : "bert ") << mode << " d = " << d);
        const Config c = tiny(arch, mode, d, m, 2);
        auto data = [&] { return config_loader(c); };
        auto a = make(c);
        auto la = data();
        auto losses = a->run(kSteps, *la);
        REQUIRE_MESSAGE(losses.ok(), (losses.ok() ? "" : losses.error().message));
        CHECK(la->position() == static_cast<uint64_t>(kSteps * m));
        const SerialExecutor& r0 = a->replica(0);
        const SerialExecutor& r1 = a->replica(1);
        for (int l = 0; l < r0.model().num_layers(); ++l) {
          INFO("layer " << l);
          CHECK(same_bits(r0.params(l), r1.params(l)));
        }
        for (int s = 0; s < d; ++s)
          for (int i = 0; i < r0.optimizer(s).num_layers(); ++i)
            CHECK(same_bits(r0.optimizer(s).state(i), r1.optimizer(s).state(i)));

        // repeatable
        auto b = make(c);
        auto lb = data();
        auto again = b->run(kSteps, *lb);
        REQUIRE(again.ok());
        CHECK(same_bits(*losses, *again));
        for (int l = 0; l < r0.model().num_layers(); ++l)
          CHECK(same_bits(r0.params(l), b->replica(0).params(l)));

        // one pipeline over the same global batch: the same up to the summation order
        Config one = c;
        one.pipeline.replicas = 1;
        auto single = SerialExecutor::create(one);
        REQUIRE(single.ok());
        auto l1 = data();
        auto ref = (*single)->run(kSteps, *l1);
        REQUIRE(ref.ok());
        bool differs = false;
        for (int l = 0; l < r0.model().num_layers(); ++l) {
          INFO("layer " << l);
          CHECK(relative_difference(r0.params(l), (*single)->params(l)) < 1e-5);
          differs = differs || !same_bits(r0.params(l), (*single)->params(l));
        }
        for (int s = 0; s < kSteps; ++s)
          CHECK((*losses)[static_cast<size_t>(s)] ==
                doctest::Approx((*ref)[static_cast<size_t>(s)]).epsilon(1e-5));
        // the gradients really were summed from two halves (a different order than one pass)
        CHECK(differs);
      }
    }
  }
}

TEST_CASE("a replicated 2bw run continues exactly across runs") {
  const Config c = tiny(Arch::gpt, "2bw", 2, 4, 2);
  auto whole = make(c);
  auto lw = config_loader(c);
  REQUIRE(whole->run(5, *lw).ok());
  auto parts = make(c);
  auto lp = config_loader(c);
  REQUIRE(parts->run(2, *lp).ok());
  REQUIRE(parts->run(3, *lp).ok());
  for (int r = 0; r < 2; ++r)
    for (int l = 0; l < whole->replica(r).model().num_layers(); ++l)
      CHECK(same_bits(whole->replica(r).params(l), parts->replica(r).params(l)));
}

TEST_CASE("the split gives each replica a contiguous block of every step") {
  const ReplicaSplit split{6, 3};
  CHECK(split.per_replica() == 2);
  std::vector<Microbatch> all(12);
  for (size_t i = 0; i < all.size(); ++i) all[i].index = static_cast<int64_t>(i);
  std::vector<int64_t> got;
  for (const Microbatch& mb : replica_batches(all, split, 1)) got.push_back(mb.index);
  CHECK(got == std::vector<int64_t>{2, 3, 8, 9});
  for (int n = 0; n < 4; ++n) CHECK(split.global_index(1, n) == got[static_cast<size_t>(n)]);
  CHECK(split.global_index(0, 5) == 13);  // step 2, first replica's second
  CHECK(combine_replica_losses(std::vector<double>{1.0, 2.0, 4.5}) == doctest::Approx(2.5));
}

TEST_CASE("replicas refuse a config they cannot run") {
  Config c = tiny(Arch::gpt, "1f1b", 2, 4, 3);
  auto e = ReplicatedExecutor::create(c);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("must divide pipeline.microbatches = 4") != std::string::npos);
  // one replica of several alone has nobody to sum with
  c.pipeline.replicas = 2;
  auto lone = SerialExecutor::create(c);
  REQUIRE_FALSE(lone.ok());
  CHECK(lone.error().message.find("needs a GradientReducer") != std::string::npos);
}

namespace {

// Records the gradients each update hands to the reducer (one replica: nothing to sum).
class SpyReducer final : public GradientReducer {
 public:
  int replicas() const override { return 1; }
  Status all_reduce(int stage, long step, std::span<float> data) override {
    seen[{stage, step}].assign(data.begin(), data.end());
    return {};
  }
  std::map<std::pair<int, long>, std::vector<float>> seen;
};

}  // namespace

TEST_CASE("a stage reports each layer's gradients once they are final, last layer first") {
  for (const char* mode : {"1f1b", "2bw", "gpipe"}) {
    INFO(mode);
    Config c = tiny(Arch::gpt, mode, 2, 4, 1);
    SpyReducer spy;
    auto e = SerialExecutor::create(c, false, nullptr, &spy);
    REQUIRE(e.ok());
    // (stage, step) -> the layers reported, in order, and their values when reported
    std::map<std::pair<int, long>, std::vector<int>> order;
    std::map<std::pair<int, long>, std::vector<std::vector<float>>> values;
    for (int r = 0; r < 2; ++r) {
      (*e)->worker(r).on_final_gradients([&, r](int layer, long step, std::span<float> g) {
        order[{r, step}].push_back(layer);
        values[{r, step}].emplace_back(g.begin(), g.end());
      });
    }
    auto data = config_loader(c);
    REQUIRE((*e)->run(3, *data).ok());
    REQUIRE((*e)->run(2, *data).ok());  // 2bw: a continued run
    REQUIRE(spy.seen.size() == 10);     // 5 updates of 2 stages
    for (const auto& [key, grads] : spy.seen) {
      CAPTURE(key.first);
      CAPTURE(key.second);
      const StageWorker& w = (*e)->worker(key.first);
      std::vector<int> want;
      for (int i = w.num_layers() - 1; i >= 0; --i)
        if (w.model().layer(w.first_layer() + i).param_floats() > 0) want.push_back(i);
      CHECK(order[key] == want);
      // what was reported, in layer order, is what the update summed
      std::vector<float> joined;
      const auto& vals = values[key];
      for (size_t k = vals.size(); k-- > 0;)
        joined.insert(joined.end(), vals[k].begin(), vals[k].end());
      CHECK(same_bits(joined, grads));
    }
  }
}
