// pipeline.precision: the names and the machine check; bf16 training of a GPT and a BERT on the
// synthetic corpus follows fp32's loss within a stated margin over 300 steps.
#include "engine/execution/compute_precision.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "engine/execution/serial_executor.hpp"
#include "kernels/bf16_gemm.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

TEST_CASE("resolve_precision: fp32 always, bf16 where the CPU has bf16 instructions") {
  CHECK(resolve_precision("fp32").value() == Precision::fp32);
  auto bad = resolve_precision("fp16");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message ==
        "pipeline.precision = \"fp16\": unknown precision (allowed: fp32, bf16)");
  auto b = resolve_precision("bf16");
  if (bf16_support().native) {
    CHECK(b.value() == Precision::bf16);
  } else {
    REQUIRE_FALSE(b.ok());
    CHECK(b.error().message.find("this CPU has no bf16 instructions") != std::string::npos);
  }
}

namespace {

// The mean loss of each of `steps` steps of a 2-stage 1f1b pipeline in `precision`.
std::vector<double> train(Arch arch, const std::string& precision, int steps) {
  ModelOptions m = tiny_model(arch, true, 7);
  m.vocab_size = 32;
  m.context = 16;
  m.width = 32;
  m.heads = 2;
  Config c = tiny_config("1f1b", 2, 2, m);
  c.pipeline.microbatch_size = 4;
  c.pipeline.seq_len = 16;
  c.pipeline.precision = precision;
  c.optimizer.lr = 3e-3f;
  auto ex = SerialExecutor::create(c);
  REQUIRE_MESSAGE(ex.ok(), (ex.ok() ? "" : ex.error().message));
  auto data = config_loader(c);
  auto losses = (*ex)->run(steps, *data);
  REQUIRE(losses.ok());
  return *losses;
}

double mean_of_last(const std::vector<double>& v, size_t n) {
  return std::accumulate(v.end() - static_cast<long>(n), v.end(), 0.0) / static_cast<double>(n);
}

}  // namespace

TEST_CASE("bf16 training follows fp32's loss within 1% over 300 steps, GPT and BERT" *
          doctest::skip(!bf16_support().native)) {
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    CAPTURE(static_cast<int>(arch));
    const auto f = train(arch, "fp32", 300), b = train(arch, "bf16", 300);
    const double lf = mean_of_last(f, 50), lb = mean_of_last(b, 50);
    MESSAGE(std::string(arch == Arch::gpt ? "GPT" : "BERT")
            << ": loss " << f.front() << " -> " << lf << " (fp32), " << b.front() << " -> " << lb
            << " (bf16), mean of the last 50 steps");
    CHECK(lf < 0.9 * f.front());  // it learns: the comparison is not of two flat lines
    CHECK(std::fabs(lb - lf) <= 0.01 * lf);
    for (double x : b) REQUIRE(std::isfinite(x));
  }
}
