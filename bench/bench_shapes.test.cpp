// Shape tests: the models have the published / hand-counted parameter counts and the FLOP
// count follows the documented formula.
#include "bench/bench_shapes.hpp"

#include <doctest/doctest.h>

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {
// GPT-2 style parameter count, written out independently of the engine's layers:
// wte V·C + wpe maxT·C + L·(two layernorms 4C + qkv 3C²+3C + proj C²+C + fc 4C²+4C +
// fc_proj 4C²+C) + ln_f 2C.
long hand_count(long V, long maxT, long C, long L) {
  return V * C + maxT * C +
         L * (4 * C + 3 * C * C + 3 * C + C * C + C + 4 * C * C + 4 * C + 4 * C * C + C) + 2 * C;
}
}  // namespace

TEST_CASE("shapes are the documented configurations") {
  auto tiny = find_bench_shape("tiny");
  REQUIRE(tiny.ok());
  CHECK(tiny->describe() == "V256 T128 d128 L4 H4 B8");
  auto small = find_bench_shape("small");
  REQUIRE(small.ok());
  CHECK(small->describe() == "V8192 T256 d384 L6 H6 B8");
  auto gpt2 = find_bench_shape("gpt2");
  REQUIRE(gpt2.ok());
  CHECK(gpt2->describe() == "V50257 T64 d768 L12 H12 B4");
  CHECK(gpt2->model.context == 1024);
  CHECK_FALSE(find_bench_shape("medium").ok());
}

TEST_CASE("parameter counts: GPT-2 small is 124,439,808, the others match a hand count") {
  auto gpt2 = Model::build(find_bench_shape("gpt2")->model);
  REQUIRE(gpt2.ok());
  CHECK(gpt2->unique_parameters() == 124439808u);
  for (const BenchShape& s : bench_shapes()) {
    auto m = Model::build(s.model);
    REQUIRE(m.ok());
    const ModelOptions& o = s.model;
    CHECK(static_cast<long>(m->unique_parameters()) ==
          hand_count(o.vocab_size, o.context, o.width, o.depth));
    CHECK(matmul_parameters(*m) == hand_count(o.vocab_size, o.context, o.width, o.depth) -
                                       static_cast<long>(o.context) * o.width);
  }
}

TEST_CASE("model FLOPs per step: 6·N·BT + 12·L·T·C·BT") {
  auto gpt2 = Model::build(find_bench_shape("gpt2")->model);
  REQUIRE(gpt2.ok());
  const double tokens = 4.0 * 64;
  const double expect = 6.0 * (124439808.0 - 1024.0 * 768) * tokens + 12.0 * 12 * 64 * 768 * tokens;
  CHECK(step_model_flops(*gpt2, 4, 64) == doctest::Approx(expect).epsilon(1e-12));
  CHECK(step_model_flops(*gpt2, 4, 64) == doctest::Approx(191.74e9).epsilon(1e-3));
}
