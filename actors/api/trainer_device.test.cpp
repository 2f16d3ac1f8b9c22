// The Trainer with its stages off the host (pipeline.device): "checked" puts every stage on a
// CheckedBackend, whose memory is closed to the host between operations, so any read or write of
// a stage's weights, gradients, optimizer state or activations that does not go through the
// backend stops the test. Such a run must train, evaluate, checkpoint and resume to the bits of
// the same run on the CPU, on both backends; its checkpoints are the CPU's; layers move between
// such stages as between the CPU's. "cuda" where no GPU is usable is an error naming the key.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <string>
#include <vector>

#include "actors/api/actorpipe/trainer.hpp"
#include "engine/checkpoint/checkpoint.hpp"
#include "kernels/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "tests/support/bf16_skip.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/make_trainer.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

Config tiny(const std::string& mode, int stages, int steps, const std::string& device) {
  Config c = tiny_config(mode, stages, 4, tiny_model(Arch::gpt, true, 3));
  c.optimizer.lr = 2e-2f;
  c.optimizer.grad_clip = 0.5f;
  c.train.steps = steps;
  c.pipeline.device = device;
  return c;
}

std::vector<double> train(Trainer& t) {
  std::vector<double> losses;
  t.on_step([&](const StepMetrics& m) { losses.push_back(m.loss); });
  const Status ok = t.train();
  REQUIRE_MESSAGE(ok.ok(), ok.error().message);
  return losses;
}

bool same_weights(const Trainer& a, const Trainer& b) {
  const auto wa = a.weights(), wb = b.weights();
  if (wa.size() != wb.size() || wa.empty()) return false;
  for (size_t i = 0; i < wa.size(); ++i) {
    if (wa[i].name != wb[i].name || !same_bits(wa[i].f32, wb[i].f32)) return false;
  }
  return true;
}

const char* name(Backend b) {
  return b == Backend::serial ? "serial" : "actors";
}

}  // namespace

TEST_CASE("pipeline.device = checked trains and evaluates to the cpu's bits, on both backends") {
  for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    for (Backend backend : {Backend::serial, Backend::actors}) {
      const std::string what = fmt::format("{} on {}", mode, name(backend));
      CAPTURE(what);
      Config cpu = tiny(mode, 3, 3, "cpu");
      cpu.eval.every = 2;
      cpu.eval.microbatches = 2;
      Config dev = cpu;
      dev.pipeline.device = "checked";
      auto a = make_trainer(cpu, backend);
      auto b = make_trainer(dev, backend);
      std::vector<double> ea, eb;
      a->on_eval([&](const EvalMetrics& m) { ea.push_back(m.loss); });
      b->on_eval([&](const EvalMetrics& m) { eb.push_back(m.loss); });
      const auto la = train(*a);
      const auto lb = train(*b);
      REQUIRE(la.size() == 3);
      CHECK(same_bits(la, lb));
      CHECK(ea.size() == 2);
      CHECK(same_bits(ea, eb));
      CHECK(same_weights(*a, *b));
      // a span into a stage's memory would be a view the host cannot read
      CHECK_THROWS_AS(b->params(0), CheckFailure);
      CHECK(a->params(0).size() > 0);
    }
  }
}

TEST_CASE("pipeline.device = checked: checkpoints are the cpu's, and resume across devices") {
  constexpr int N = 2;
  for (const char* mode : {"1f1b", "2bw"}) {
    for (Backend backend : {Backend::serial, Backend::actors}) {
      const std::string what = fmt::format("{} on {}", mode, name(backend));
      CAPTURE(what);
      TempDir tmp;
      auto whole = make_trainer(tiny(mode, 2, 2 * N, "cpu"), backend);
      const auto lw = train(*whole);
      // the first half on each device, with a checkpoint
      std::vector<std::vector<double>> first;
      for (const char* device : {"cpu", "checked"}) {
        Config c = tiny(mode, 2, N, device);
        c.checkpoint.dir = tmp.file(device);
        auto t = make_trainer(c, backend);
        first.push_back(train(*t));
      }
      CHECK(same_bits(first[0], first[1]));
      // every tensor of the two checkpoints has the same bits
      auto on_cpu = load_checkpoint(tmp.file("cpu/final"));
      auto on_dev = load_checkpoint(tmp.file("checked/final"));
      REQUIRE(on_cpu.ok());
      REQUIRE(on_dev.ok());
      for (auto files : {&CheckpointContents::model, &CheckpointContents::optimizer,
                         &CheckpointContents::versions}) {
        const auto& x = (*on_cpu).*files;
        const auto& y = (*on_dev).*files;
        REQUIRE(x.size() == y.size());
        for (size_t i = 0; i < x.size(); ++i) {
          CHECK(x[i].name == y[i].name);
          CHECK(same_bits(x[i].f32, y[i].f32));
        }
      }
      if (std::string(mode) == "2bw") CHECK_FALSE(on_dev->versions.empty());
      // the second half from the other device's checkpoint: the uninterrupted run's bits
      for (const auto& [from, device] :
           {std::pair{"cpu", "checked"}, {"checked", "checked"}, {"checked", "cpu"}}) {
        CAPTURE(std::string(from) + " -> " + device);
        Config next = tiny(mode, 2, 2 * N, device);
        next.checkpoint.resume = tmp.file(std::string(from) + "/final");
        auto t = make_trainer(next, backend);
        std::vector<double> both = first[0];
        const auto l2 = train(*t);
        both.insert(both.end(), l2.begin(), l2.end());
        CHECK(same_bits(lw, both));
        CHECK(same_weights(*whole, *t));
      }
    }
  }
}

TEST_CASE("pipeline.device = checked: forced layer moves train to the cpu's bits") {
  // layers move between stages off the host (their state copied out of the old stages' memory
  // and into the new stages'); in gpipe and 1f1b the moves leave the run as it is without them
  for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    CAPTURE(std::string(mode));
    Config cpu = tiny(mode, 3, 6, "cpu");
    cpu.model.depth = 4;  // 6 layers
    cpu.pipeline.partition.counts = {2, 2, 2};
    const Config still = cpu;
    cpu.migration.moves = "2: 1, 3, 2; 4: 3, 2, 1";
    Config dev = cpu;
    dev.pipeline.device = "checked";
    auto a = make_trainer(cpu, Backend::actors);
    auto b = make_trainer(dev, Backend::actors);
    std::vector<MigrationEvent> events;
    b->on_migration([&](const MigrationEvent& e) { events.push_back(e); });
    const auto la = train(*a);
    const auto lb = train(*b);
    REQUIRE(la.size() == 6);
    CHECK(same_bits(la, lb));
    CHECK(same_weights(*a, *b));
    REQUIRE(events.size() == 2);
    for (const MigrationEvent& e : events) {
      CHECK(e.moved);
      CHECK(e.bytes_moved > 0);
      CHECK(e.error.empty());
    }
    CHECK(events.back().to == std::vector<int>{3, 2, 1});
    if (std::string(mode) == "gpipe" || std::string(mode) == "1f1b") {
      auto c = make_trainer(still, Backend::actors);
      CHECK(same_bits(train(*c), lb));
      CHECK(same_weights(*c, *b));
    }
  }
}

TEST_CASE("pipeline.device = checked with precision = bf16: the cpu's bf16 bits") {
  if (actorpipe::testing::skip_without_bf16()) return;
  for (const char* mode : {"1f1b", "2bw"}) {
    for (Backend backend : {Backend::serial, Backend::actors}) {
      const std::string what = fmt::format("{} on {}", mode, name(backend));
      CAPTURE(what);
      Config cpu = tiny(mode, 2, 2, "cpu");
      cpu.pipeline.precision = "bf16";
      Config dev = cpu;
      dev.pipeline.device = "checked";
      auto a = make_trainer(cpu, backend);
      auto b = make_trainer(dev, backend);
      CHECK(same_bits(train(*a), train(*b)));
      CHECK(same_weights(*a, *b));
    }
  }
}

TEST_CASE("pipeline.device = checked with replicas (serial backend): the cpu's bits") {
  // the replicas' gradients of each stage summed through host memory (all_reduce_in)
  for (const char* mode : {"gpipe", "1f1b", "2bw"}) {
    CAPTURE(std::string(mode));
    Config cpu = tiny(mode, 2, 3, "cpu");
    cpu.pipeline.replicas = 2;
    Config dev = cpu;
    dev.pipeline.device = "checked";
    auto a = make_trainer(cpu, Backend::serial);
    auto b = make_trainer(dev, Backend::serial);
    CHECK(same_bits(train(*a), train(*b)));
    CHECK(same_weights(*a, *b));
  }
}

TEST_CASE("pipeline.device = cuda: refused where no GPU is usable, naming the key and why") {
  const std::string why = cuda_unavailable_reason();
  const Config c = tiny("1f1b", 2, 1, "cuda");
  for (Backend backend : {Backend::serial, Backend::actors}) {
    CAPTURE(name(backend));
    TrainerOptions o;
    o.backend = backend;
    auto t = Trainer::create(c, o);
    if (why.empty()) {
      // a GPU: the run trains (the GPU suite compares it with the CPU: tests/cuda)
      REQUIRE_MESSAGE(t.ok(), t.error().message);
      CHECK((*t)->train().ok());
    } else {
      REQUIRE_FALSE(t.ok());
      CHECK(t.error().message.find("pipeline.device = \"cuda\"") != std::string::npos);
      CHECK(t.error().message.find(why) != std::string::npos);
    }
  }
}
