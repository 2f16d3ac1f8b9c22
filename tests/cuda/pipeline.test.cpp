// A pipeline whose stages compute on GPUs (pipeline.device = "cuda": stage r on GPU r mod the
// GPUs visible) against the same pipeline on the CPU: the losses of three steps and every
// parameter after them, with tolerances, in 1f1b, 2bw and xpipe, GPT and BERT, and the losses in
// bf16;
// two GPU runs with the same bits. Without a usable GPU those cases print "SKIPPED: <reason>". The
// same comparison with pipeline.device = "checked" (exact) runs everywhere, so the harness itself
// is tested here.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "engine/execution/serial_executor.hpp"
#include "kernels/internal/test_util.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/checked_devices.hpp"
#include "tests/support/gpu_skip.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

struct PipelineRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;  // per global layer, read out of its stage's memory
};

Config pipeline(const std::string& mode, Arch arch, const std::string& device) {
  ModelOptions m = tiny_model(arch, true, 5);
  m.width = 64;  // products big enough for cuBLAS to tile
  m.heads = 4;
  Config c = tiny_config(mode, 2, 4, m);
  c.optimizer.lr = 1e-3f;
  c.optimizer.weight_decay = 0.1f;
  c.optimizer.grad_clip = 1.0f;
  c.pipeline.device = device;
  return c;
}

PipelineRun run(const Config& c, int steps) {
  auto exec = SerialExecutor::create(c);
  REQUIRE_MESSAGE(exec.ok(), exec.error().message);
  auto data = config_loader(c);
  auto losses = (*exec)->run(steps, *data);
  REQUIRE_MESSAGE(losses.ok(), losses.error().message);
  PipelineRun out{*losses, {}};
  for (int r = 0; r < (*exec)->stages(); ++r) {
    StageWorker& w = (*exec)->worker(r);
    for (int i = 0; i < w.num_layers(); ++i)
      out.params.push_back(host_copy(w.memory(), w.params(i)));
  }
  return out;
}

// got follows want: each loss within rtol, each parameter within atol + rtol |want|
void check_follows(const PipelineRun& got, const PipelineRun& want, double atol, double rtol) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (size_t s = 0; s < want.losses.size(); ++s) {
    if (rtol == 0.0) {
      CHECK(same_bits(got.losses[s], want.losses[s]));
    } else {
      CHECK(got.losses[s] == doctest::Approx(want.losses[s]).epsilon(rtol));
    }
  }
  REQUIRE(got.params.size() == want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i) {
    check_close("layer " + std::to_string(i) + " parameters", got.params[i],
                std::vector<double>(want.params[i].begin(), want.params[i].end()), atol, rtol);
  }
}

void compare_with_cpu(const std::string& device, double atol, double rtol) {
  for (const char* mode : {"1f1b", "2bw", "xpipe"}) {
    for (Arch arch : {Arch::gpt, Arch::bert}) {
      const std::string what = std::string(mode) + (arch == Arch::gpt ? " GPT" : " BERT");
      CAPTURE(what);
      const PipelineRun cpu = run(pipeline(mode, arch, "cpu"), 3);
      const PipelineRun dev = run(pipeline(mode, arch, device), 3);
      check_follows(dev, cpu, atol, rtol);
    }
  }
}

}  // namespace

TEST_CASE("a 2-stage pipeline on GPUs follows the same pipeline on the CPU") {
  if (skip_without_gpu()) return;
  compare_with_cpu("cuda", 1e-5, 1e-4);
}

TEST_CASE("two runs of a GPU pipeline have the same bits") {
  if (skip_without_gpu()) return;
  const Config c = pipeline("2bw", Arch::gpt, "cuda");
  const PipelineRun a = run(c, 3), b = run(c, 3);
  CHECK(same_bits(a.losses, b.losses));
  for (size_t i = 0; i < a.params.size(); ++i) CHECK(same_bits(a.params[i], b.params[i]));
}

// bf16: the products' operands round alike on both, only the order of the f32 sums differs, so
// the losses follow the CPU's bf16 closely; the parameters after AdamW are not compared element by
// element (for a gradient near zero AdamW moves a weight by about lr whichever its sign)
TEST_CASE("a 2-stage pipeline in bf16 on GPUs follows the same pipeline in bf16 on the CPU") {
  if (skip_without_gpu_or_bf16()) return;
  for (const char* mode : {"1f1b", "2bw"}) {
    for (Arch arch : {Arch::gpt, Arch::bert}) {
      const std::string what = std::string(mode) + (arch == Arch::gpt ? " GPT" : " BERT");
      CAPTURE(what);
      Config cpu = pipeline(mode, arch, "cpu");
      cpu.pipeline.precision = "bf16";
      Config gpu = cpu;
      gpu.pipeline.device = "cuda";
      const PipelineRun want = run(cpu, 3), got = run(gpu, 3);
      REQUIRE(got.losses.size() == want.losses.size());
      for (size_t s = 0; s < want.losses.size(); ++s)
        CHECK(got.losses[s] == doctest::Approx(want.losses[s]).epsilon(1e-4));
    }
  }
}

TEST_CASE("the comparison itself: a pipeline on the checked device equals the CPU's exactly") {
  compare_with_cpu("checked", 0.0, 0.0);
}
