// Serial executor with stages on a backend other than their CPU one: every stage on a
// CheckedBackend (the CPU kernels on memory of its own, closed to the host between ops: the rules
// of a device where no device is) computes the bits of the same executor on the CPU, in every
// mode a stage may run off the host, for GPT and BERT, tied and untied, AdamW and SGD, clipped;
// a pipeline with some stages on the host and some off it too. Its evaluation and a second run
// continue exactly. What a stage off the host cannot run yet is refused, naming it.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/execution/serial_executor.hpp"
#include "kernels/bf16_gemm.hpp"
#include "kernels/check.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/checked_devices.hpp"
#include "tests/support/tiny_executor.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

std::unique_ptr<SerialExecutor> executor(const Model& model, const Partition& p,
                                         const OptimizerOptions& opt, Mode mode, int m,
                                         const std::vector<ComputeBackend*>& backends) {
  SerialExecutorOptions o;
  o.mode = mode;
  o.microbatches = m;
  o.backends = backends;
  return tiny_executor(model, p, opt, o);
}

// layer i's newest parameters, read on the host from whichever memory its stage keeps them in
std::vector<float> params(const SerialExecutor& e, int layer) {
  return host_copy(e.worker(e.partition().stage_of(layer)).memory(), e.params(layer));
}

void check_same(const SerialExecutor& a, const SerialExecutor& b) {
  for (int i = 0; i < a.model().num_layers(); ++i) {
    INFO("layer " << i);
    CHECK(same_bits(params(a, i), params(b, i)));
  }
}

// `steps` steps of both executors on `mbs`: the same losses and weights, bit for bit
void check_runs_alike(SerialExecutor& off, SerialExecutor& cpu, int steps,
                      std::span<const Microbatch> mbs) {
  const auto want = cpu.run(steps, mbs);
  const auto got = off.run(steps, mbs);
  REQUIRE_MESSAGE(got.ok(), (got.ok() ? "" : got.error().message));
  REQUIRE(want.ok());
  CHECK(*got == *want);
  check_same(off, cpu);
}

}  // namespace

TEST_CASE(
    "stages on a checked backend compute the CPU stages' bits in gpipe, 1f1b, 2bw and "
    "pipedream") {
  constexpr int kSteps = 3, m = 2;
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (bool tied : {true, false}) {
      for (const OptimizerOptions& opt : {clipped_adamw(), clipped_sgd()}) {
        const Model model = build_model(tiny_model(arch, tied, 11));
        const auto mbs = tiny_batches(arch, model.options().vocab_size, m * kSteps, 5);
        for (int d : {1, 2, 4}) {
          const Partition p = *Partition::even(model.num_layers(), d);
          for (Mode mode : {Mode::gpipe, Mode::onef1b, Mode::twobw, Mode::pipedream, Mode::xpipe}) {
            if (mode == Mode::twobw && d > m) continue;  // 2bw needs m >= d
            INFO(std::string(arch == Arch::gpt ? "gpt" : "bert")
                 << " tied " << tied << " " << opt.kind << " d=" << d << " " << to_string(mode));
            auto cpu = executor(model, p, opt, mode, m, {});
            CheckedDevices dev(d);
            auto off = executor(model, p, opt, mode, m, dev.pointers);
            const int steps = mode == Mode::pipedream ? m * kSteps : kSteps;  // a step each
            check_runs_alike(*off, *cpu, steps, mbs);
            for (const auto& b : dev.backends) CHECK(b->ops() > 0);  // the stages ran there
          }
        }
      }
    }
  }
}

TEST_CASE("a pipeline with stages on and off the host, evaluated and run again, keeps the bits") {
  constexpr int kSteps = 2, m = 3;
  const OptimizerOptions opt = clipped_adamw();
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    const Model model = build_model(tiny_model(arch, true, 11));
    const auto mbs = tiny_batches(arch, model.options().vocab_size, 2 * m * kSteps, 9);
    const Partition p = *Partition::from_counts(model.num_layers(), std::vector<int>{1, 2, 1});
    for (const std::vector<int>& host : {std::vector<int>{0}, std::vector<int>{1}, {0, 2}}) {
      for (Mode mode : {Mode::onef1b, Mode::twobw}) {
        INFO(std::string(arch == Arch::gpt ? "gpt" : "bert")
             << " " << to_string(mode) << " host stages " << host.size() << " first " << host[0]);
        auto cpu = executor(model, p, opt, mode, m, {});
        CheckedDevices dev(3, host);
        auto mixed = executor(model, p, opt, mode, m, dev.pointers);
        const std::span<const Microbatch> all(mbs);
        for (int run = 0; run < 2; ++run) {
          const auto part =
              all.subspan(static_cast<size_t>(run * m * kSteps), static_cast<size_t>(m * kSteps));
          const auto want = cpu->run(kSteps, part);
          const auto got = mixed->run(kSteps, part);
          REQUIRE_MESSAGE(got.ok(), (got.ok() ? "" : got.error().message));
          CHECK(*got == *want);
          const auto held_out = part.first(2);
          const auto e_want = cpu->evaluate(held_out);
          const auto e_got = mixed->evaluate(held_out);
          REQUIRE(e_got.ok());
          CHECK(same_bits(e_got->loss, e_want->loss));
        }
        check_same(*mixed, *cpu);
      }
    }
  }
}

// the dc and secant corrections' Δ = W_now − W_stale made with the backend's ops (and secant's
// state in the stage's memory), the CPU's bits
TEST_CASE("the dc and secant corrections on stages off the host: the CPU stages' bits") {
  constexpr int kSteps = 3, m = 2;
  for (const char* correction : {"dc", "secant+nesterov"})
    for (const char* kind : {"adamw", "sgd"}) {
      OptimizerOptions opt = std::string(kind) == "adamw" ? clipped_adamw() : clipped_sgd();
      opt.delay_correction = correction;
      for (Arch arch : {Arch::gpt, Arch::bert}) {
        const Model model = build_model(tiny_model(arch, true, 11));
        const auto mbs = tiny_batches(arch, model.options().vocab_size, m * kSteps, 5);
        const Partition p = *Partition::even(model.num_layers(), 2);
        for (Mode mode : {Mode::twobw, Mode::pipedream}) {
          INFO(correction << " " << kind << " " << (arch == Arch::gpt ? "gpt" : "bert") << " "
                          << to_string(mode));
          auto cpu = executor(model, p, opt, mode, m, {});
          CheckedDevices dev(2);
          auto off = executor(model, p, opt, mode, m, dev.pointers);
          const int steps = mode == Mode::pipedream ? m * kSteps : kSteps;
          check_runs_alike(*off, *cpu, steps, mbs);
        }
      }
    }
}

// bf16 off the host is the backend's own: it rounds each product's operands (no weight copies,
// f32 activations), which are the values the CPU stages' weight copies and bf16 activations hold
TEST_CASE("bf16 products on stages off the host compute the CPU stages' bf16 bits") {
  if (!bf16_support().native) {
    MESSAGE("this CPU has no bf16 instructions: the CPU's bf16 reference cannot run");
    return;
  }
  constexpr int kSteps = 2, m = 2;
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    const Model model = build_model(tiny_model(arch, true, 11));
    const auto mbs = tiny_batches(arch, model.options().vocab_size, m * kSteps, 5);
    const Partition p = *Partition::even(model.num_layers(), 2);
    for (Mode mode : {Mode::gpipe, Mode::onef1b, Mode::twobw, Mode::pipedream}) {
      INFO(std::string(arch == Arch::gpt ? "gpt" : "bert") << " " << to_string(mode));
      SerialExecutorOptions o;
      o.mode = mode;
      o.microbatches = m;
      o.precision = Precision::bf16;
      // stage 0 off the host and stage 1 on it, then the other way round: the loss head off
      // the host takes the f32 dlogits and rounds them for its products, on the host it rounds
      // each row as its backward makes it
      for (int on_host : {1, 0}) {
        INFO("stage " << on_host << " on the host");
        CheckedDevices dev(2, {on_host});
        SerialExecutorOptions d = o;
        d.backends = dev.pointers;
        auto off = tiny_executor(model, p, clipped_adamw(), d);
        auto ref = tiny_executor(model, p, clipped_adamw(), o);
        const int steps = mode == Mode::pipedream ? m * kSteps : kSteps;
        check_runs_alike(*off, *ref, steps, mbs);
        CHECK(dev.backends[0]->precision() == Precision::bf16);
      }
    }
  }
  // and the same run in fp32 differs: the products above did round
  const Model model = build_model(tiny_model(Arch::gpt, true, 11));
  const auto mbs = tiny_batches(Arch::gpt, model.options().vocab_size, 2, 5);
  const Partition p = *Partition::even(model.num_layers(), 2);
  SerialExecutorOptions o;
  o.microbatches = 2;
  CheckedDevices dev(2);
  o.backends = dev.pointers;
  auto fp32 = tiny_executor(model, p, clipped_adamw(), o);
  o.precision = Precision::bf16;
  CheckedDevices dev16(2);
  o.backends = dev16.pointers;
  auto bf16 = tiny_executor(model, p, clipped_adamw(), o);
  const auto a = fp32->run(1, mbs), b = bf16->run(1, mbs);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK_FALSE(same_bits((*a)[0], (*b)[0]));
}

TEST_CASE("what a stage off the host cannot run yet is refused, naming the stage and the cause") {
  const Model model = build_model(tiny_model(Arch::gpt, true, 11));
  const Partition p = *Partition::even(model.num_layers(), 2);
  CheckedDevices dev(2);
  auto refused = [&](Mode mode, const OptimizerOptions& opt) {
    SerialExecutorOptions o;
    o.mode = mode;
    o.microbatches = 2;
    o.B = kB;
    o.T = kT;
    o.backends = dev.pointers;
    auto e = SerialExecutor::create(model, p, opt, o);
    return e.ok() ? std::string() : e.error().message;
  };
  OptimizerOptions dc = clipped_adamw();
  dc.delay_correction = "dc";
  CHECK(refused(Mode::xpipe, clipped_adamw()).empty());  // the prediction on the backend
  CHECK(refused(Mode::twobw, dc).empty());               // Δ on the backend
  CHECK(refused(Mode::onef1b, clipped_adamw()).empty());

  StageWorkerOptions w;
  w.stage = 1;
  w.backend = dev.pointers[1];
  CHECK(check_stage_backend(w).ok());
  w.precision = Precision::bf16;  // the backend's own bf16 products
  CHECK(check_stage_backend(w).ok());
  w.bf16_stash = true;
  CHECK(check_stage_backend(w).error().message.find("a bf16 weight stash") != std::string::npos);
  w.bf16_stash = false;
  w.precision = Precision::fp32;
  w.replicas = 2;  // summed through host memory
  CHECK(check_stage_backend(w).ok());
  w.precision = Precision::bf16;
  w.bf16_stash = true;
  w.backend = nullptr;  // the CPU: everything
  CHECK(check_stage_backend(w).ok());
  w.backend = dev.pointers[1];
  CHECK_THROWS_WITH_AS(StageWorker(model, p, dc, w), doctest::Contains("stage 1 on checked cpu"),
                       CheckFailure);

  SerialExecutorOptions o;
  o.backends = {dev.pointers[0]};
  auto e = SerialExecutor::create(model, p, clipped_adamw(), o);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("backends: 1 entries for 2 stages") != std::string::npos);
}
