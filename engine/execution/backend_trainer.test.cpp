// BackendTrainer on the CPU backend computes the ReferenceTrainer's bits (GPT and BERT, tied,
// clipped AdamW with weight decay, and SGD with momentum; in fp32 and in bf16), so the only thing
// another backend can change is the kernels; tests/cuda holds a GPU's trainer to the same
// reference.
#include "engine/execution/backend_trainer.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <vector>

#include "engine/execution/reference_trainer.hpp"
#include "kernels/bf16_gemm.hpp"
#include "kernels/check.hpp"
#include "kernels/checked_backend.hpp"
#include "kernels/cpu_backend.hpp"
#include "tests/support/bf16_skip.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

// Three steps of two microbatches on both trainers: the same losses, gradient norms, and in the
// end every layer's parameters and gradients, bit for bit.
void check_same_steps(BackendTrainer& dev, ReferenceTrainer& ref, Arch arch, int vocab,
                      uint64_t seed) {
  const auto batches = tiny_batches(arch, vocab, 6, seed);
  for (int s = 0; s < 3; ++s) {
    const std::span<const Microbatch> step(batches.data() + 2 * s, 2);
    CHECK(same_bits(dev.step(step), ref.step(step)));
    CHECK(same_bits(dev.last_grad_norm(), ref.last_grad_norm()));
  }
  for (int i = 0; i < ref.num_layers(); ++i) {
    CAPTURE(i);
    CHECK(same_bits(dev.params(i), ref.params(i)));
    CHECK(same_bits(dev.grads(i), ref.grads(i)));
  }
  CHECK(dev.steps() == 3);
}

// The optimizer of these tests (clipped, with weight decay) of `kind`, and the tiny model's
// reference trainer with it: the unfused update (the one a backend computes), in `precision`.
OptimizerOptions optimizer(const char* kind) {
  OptimizerOptions opt = clipped_adamw();
  opt.kind = kind;
  return opt;
}
std::unique_ptr<ReferenceTrainer> reference(const ModelOptions& m, const char* kind,
                                            Precision precision = Precision::fp32) {
  auto ref = std::make_unique<ReferenceTrainer>(build_model(m), optimizer(kind), kB, kT);
  ref->set_fused_update(false);
  if (precision == Precision::bf16) ref->set_precision(Precision::bf16);
  return ref;
}

}  // namespace

TEST_CASE("on the CPU backend, the reference trainer's bits: GPT and BERT, AdamW and SGD") {
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (const char* kind : {"adamw", "sgd"}) {
      CAPTURE(static_cast<int>(arch));
      CAPTURE(kind);
      const ModelOptions m = tiny_model(arch, true, 3);
      auto ref = reference(m, kind);
      Context cpu_ctx(1);
      auto cpu = make_cpu_backend(cpu_ctx);
      BackendTrainer dev(build_model(m), optimizer(kind), kB, kT, *cpu);
      check_same_steps(dev, *ref, arch, m.vocab_size, 11);
    }
  }
}

TEST_CASE("BackendTrainer refuses what does not fit, naming it") {
  Context cpu_ctx(1);
  auto cpu = make_cpu_backend(cpu_ctx);
  const ModelOptions m = tiny_model(Arch::gpt, true, 1);
  CHECK_THROWS_WITH_AS(BackendTrainer(build_model(m), clipped_adamw(), kB, 99, *cpu),
                       doctest::Contains("T = 99 (context 8)"), CheckFailure);
  BackendTrainer t(build_model(m), clipped_adamw(), kB, kT, *cpu);
  CHECK_THROWS_WITH_AS(t.set_params(1, std::vector<float>(3, 0.0f)),
                       doctest::Contains("layer 1: 3 parameter values"), CheckFailure);
  auto wrong = tiny_batches(Arch::gpt, m.vocab_size, 1, 1);
  wrong[0].B = 1;
  CHECK_THROWS_AS(t.forward(wrong[0]), CheckFailure);
}

TEST_CASE("in bf16 on the CPU backend, the reference trainer's bf16 bits") {
  if (actorpipe::testing::skip_without_bf16()) return;
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    CAPTURE(static_cast<int>(arch));
    const ModelOptions m = tiny_model(arch, true, 4);
    ReferenceTrainer ref(build_model(m), clipped_adamw(), kB, kT);
    ref.set_precision(Precision::bf16);  // bf16 activations and weight copies: the same values
    Context cpu_ctx(1);
    auto cpu = make_cpu_backend(cpu_ctx);
    BackendTrainer dev(build_model(m), clipped_adamw(), kB, kT, *cpu);
    dev.set_precision(Precision::bf16);
    CHECK(cpu->precision() == Precision::bf16);
    const auto batches = tiny_batches(arch, m.vocab_size, 6, 12);
    for (int s = 0; s < 3; ++s) {
      const std::span<const Microbatch> step(batches.data() + 2 * s, 2);
      CHECK(same_bits(dev.step(step), ref.step(step)));
    }
    for (int i = 0; i < ref.num_layers(); ++i) CHECK(same_bits(dev.params(i), ref.params(i)));
  }
}

TEST_CASE("on a CheckedBackend, the same bits: the trainer keeps to a device backend's rules") {
  // the checked backend's memory is closed between ops, so any host access to a parameter,
  // gradient, optimizer state or activation other than through to_host/to_backend faults, and
  // every op's arguments are checked to lie whole in its memory (index arrays outside it)
  std::vector<Precision> precisions = {Precision::fp32};
  if (bf16_support().native) precisions.push_back(Precision::bf16);
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    for (Precision precision : precisions) {
      for (const char* kind : {"adamw", "sgd"}) {
        CAPTURE(static_cast<int>(arch));
        CAPTURE(static_cast<int>(precision));
        CAPTURE(kind);
        const ModelOptions m = tiny_model(arch, true, 3);
        auto ref = reference(m, kind, precision);
        Context ctx(1);
        CheckedBackend checked(ctx);
        BackendTrainer dev(build_model(m), optimizer(kind), kB, kT, checked);
        if (precision == Precision::bf16) dev.set_precision(Precision::bf16);
        check_same_steps(dev, *ref, arch, m.vocab_size, 13);
        CHECK(checked.ops() > 0);
      }
    }
  }
}
