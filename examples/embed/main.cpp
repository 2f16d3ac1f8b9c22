// embed: a program that trains a small GPT through the installed actorpipe package: a config,
// a Trainer with a metrics callback, a checkpoint, a second Trainer resuming it, the weights.
#include <actorpipe/trainer.hpp>
#include <cstdio>
#include <kernels/blas_core.hpp>
#include <string>

namespace ap = actorpipe;

int fail(const ap::Error& e) {
  std::fprintf(stderr, "embed: %s\n", e.message.c_str());
  return 1;
}

int main(int argc, char** argv) {
  // OpenBLAS's kernels chosen again where it picked narrower ones than this CPU has, before
  // anything computes (docs/trainers.md); says what it did
  if (const std::string done = ap::use_fitting_blas_core(); !done.empty())
    std::printf("embed: %s\n", done.c_str());

  // Keys as in a TOML config file (docs/config.md); the rest keep their defaults.
  auto config = ap::config_from_string(R"(
    [model]
    vocab_size = 32
    context = 16
    width = 32
    depth = 2
    heads = 2
    [pipeline]
    mode = "2bw"
    stages = 2
    microbatches = 2
    microbatch_size = 4
    [optimizer]
    lr = 5e-3
    [train]
    steps = 30
    [checkpoint]
    dir = "embed-checkpoints"
    every = 10
  )");
  if (!config) return fail(config.error());
  if (argc > 1) config->checkpoint.dir = argv[1];

  auto trainer = ap::Trainer::create(*config);  // the actor engine: one thread per stage
  if (!trainer) return fail(trainer.error());
  double first_loss = 0.0;
  (*trainer)->on_step([&](const ap::StepMetrics& m) {
    if (m.step == 1) first_loss = m.loss;
    if (m.step % 10 == 0)
      std::printf("step %lld  loss %.4f  %.0f tokens/s\n", static_cast<long long>(m.step), m.loss,
                  m.tokens_per_second());
  });
  if (auto ok = (*trainer)->train(); !ok) return fail(ok.error());  // writes step-10/20/30, final
  const double loss = (*trainer)->last_metrics().loss;
  std::printf("trained %lld steps: loss %.4f -> %.4f (floor %.4f)\n",
              static_cast<long long>((*trainer)->step_count()), first_loss, loss,
              (*trainer)->loss_floor().value_or(0.0));

  // Continue from the latest checkpoint in the directory, step by step, on the serial executor.
  config->checkpoint.resume = config->checkpoint.dir;
  config->checkpoint.dir.clear();
  config->checkpoint.every = 0;
  config->train.steps = 35;
  ap::TrainerOptions serial;
  serial.backend = ap::Backend::serial;
  auto resumed = ap::Trainer::create(*config, serial);
  if (!resumed) return fail(resumed.error());
  std::printf("resumed %s at step %lld\n", (*resumed)->resumed_from().c_str(),
              static_cast<long long>((*resumed)->step_count()));
  while ((*resumed)->step_count() < config->train.steps) {
    auto m = (*resumed)->step();
    if (!m) return fail(m.error());
  }
  for (const ap::NamedTensor& w : (*resumed)->weights()) {
    if (w.name == "layers.0.wte")
      std::printf("%s: %lld x %lld\n", w.name.c_str(), static_cast<long long>(w.shape[0]),
                  static_cast<long long>(w.shape[1]));
  }
  return loss < first_loss ? 0 : 1;
}
