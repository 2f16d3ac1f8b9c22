// custom_layers: a program that trains a model of its own layers on data of its own through the
// installed actorpipe package. It checks what a user of the embedding API relies on, and exits
// non-zero naming the first check that fails:
//  1. the model's gradients against finite differences (actorpipe's check_gradients);
//  2. every mode, actors backend equal to the serial executor bitwise;
//  3. training reaches near the data's loss floor;
//  4. a run resumed from a checkpoint equals the uninterrupted one bitwise.
#include <actorpipe/engine/execution/gradient_check.hpp>
#include <actorpipe/trainer.hpp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "data.hpp"
#include "layers.hpp"

namespace ap = actorpipe;

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "custom_layers: %s\n", what.c_str());
  return 1;
}

bool same_bits(const std::vector<ap::NamedTensor>& a, const std::vector<ap::NamedTensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].f32.size() != b[i].f32.size() ||
        std::memcmp(a[i].f32.data(), b[i].f32.data(), a[i].f32.size() * sizeof(float)))
      return false;
  }
  return true;
}

struct Run {
  std::vector<ap::NamedTensor> weights;
  double first_loss = 0.0, last_loss = 0.0;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "custom-layers-checkpoints";
  // [model] describes the model below: vocab_size, context, width, depth (its hidden layers)
  // and init_seed must be the model's; heads means nothing to it.
  auto config = ap::config_from_string(R"(
    [model]
    vocab_size = 32
    context = 16
    width = 32
    depth = 2
    heads = 1
    [pipeline]
    stages = 2
    microbatches = 4
    microbatch_size = 4
    [optimizer]
    lr = 1e-2
  )");
  if (!config) return fail(config.error().message);
  const ap::ModelOptions& shape = config->model;

  // Your own layers: a model is an ordered list of them
  auto built = custom::make_model(shape);
  if (!built) return fail(built.error().message);
  auto model = std::make_shared<const ap::Model>(std::move(*built));
  // ... and your own data: microbatch n as a function of n
  auto data = std::make_shared<const custom::AffineSuccessorData>(
      config->pipeline.microbatch_size, shape.context, shape.vocab_size, /*seed=*/7);

  // 1. gradients against finite differences
  std::vector<ap::Microbatch> probe{data->microbatch(0), data->microbatch(1)};
  auto check = ap::check_gradients(*model, probe);
  if (!check) return fail(check.error().message);
  if (!check->passed()) return fail("gradient check:\n" + check->describe());
  std::printf("gradient check: %zu parameter tensors and %zu layers passed\n", check->slots.size(),
              check->splits.size());

  auto train = [&](ap::Config c, ap::Backend backend, Run& out) -> ap::Status {
    ap::TrainerOptions options;
    options.backend = backend;
    options.model = model;
    options.data = data;
    auto trainer = ap::Trainer::create(c, options);
    if (!trainer) return trainer.error();
    (*trainer)->on_step([&](const ap::StepMetrics& m) {
      if (m.step == 1) out.first_loss = m.loss;
      out.last_loss = m.loss;
    });
    if (auto ok = (*trainer)->train(); !ok) return ok.error();
    out.weights = (*trainer)->weights();
    return {};
  };

  // 2. every mode: the actor engine equals the serial executor bitwise
  for (const char* mode : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    ap::Config c = *config;
    c.pipeline.mode = mode;
    c.train.steps = 12;
    Run actors, serial;
    if (auto ok = train(c, ap::Backend::actors, actors); !ok) return fail(ok.error().message);
    if (auto ok = train(c, ap::Backend::serial, serial); !ok) return fail(ok.error().message);
    if (!same_bits(actors.weights, serial.weights))
      return fail(std::string(mode) + ": the actors backend and the serial executor differ");
    std::printf("%-9s actors == serial bitwise after %d steps, loss %.4f -> %.4f\n", mode,
                c.train.steps, actors.first_loss, actors.last_loss);
  }

  // 3. and 4. train with checkpoints; resume from the middle one
  ap::Config c = *config;
  c.pipeline.mode = "1f1b";
  c.train.steps = 300;
  c.checkpoint.dir = dir;
  c.checkpoint.every = 150;
  c.checkpoint.overwrite = true;
  Run whole;
  if (auto ok = train(c, ap::Backend::actors, whole); !ok) return fail(ok.error().message);
  const double floor = data->loss_floor().value();
  std::printf("trained %d steps: loss %.4f -> %.4f (the data's floor %.4f)\n", c.train.steps,
              whole.first_loss, whole.last_loss, floor);
  if (!(whole.last_loss < floor + 0.25 * (whole.first_loss - floor)))
    return fail("training did not get within a quarter of the way to the loss floor");

  ap::Config resumed_config = c;
  resumed_config.checkpoint.resume = dir + "/step-150";
  resumed_config.checkpoint.dir = dir + "-resumed";
  Run resumed;
  if (auto ok = train(resumed_config, ap::Backend::actors, resumed); !ok)
    return fail(ok.error().message);
  if (!same_bits(whole.weights, resumed.weights))
    return fail("the run resumed from step 150 differs from the uninterrupted one");
  std::printf("resumed from step-150: the same bits as the uninterrupted run\n");
  for (const ap::NamedTensor& t : whole.weights) {  // checkpoint names: the layers' own
    if (t.name.find("layers.1.") != 0) continue;
    std::string dims;
    for (int64_t d : t.shape) dims += (dims.empty() ? "" : " x ") + std::to_string(d);
    std::printf("%s: %s\n", t.name.c_str(), dims.c_str());
  }
  std::printf("custom_layers: all checks passed\n");
  return 0;
}
