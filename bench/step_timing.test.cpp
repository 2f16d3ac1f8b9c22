// Step timing tests: one small configuration measured end to end (times, floor, profile)
// and its JSON form read back to the same values.
#include "bench/step_timing.hpp"

#include <doctest/doctest.h>

#include <cmath>

#include "tests/support/bf16_skip.hpp"

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {
BenchShape micro_shape() {
  BenchShape s;
  s.name = "micro";
  s.model.vocab_size = 128;
  s.model.context = 64;
  s.model.width = 64;
  s.model.depth = 2;
  s.model.heads = 2;
  s.B = 4;
  s.T = 64;
  return s;
}
}  // namespace

TEST_CASE("random_microbatch: tokens below V, each target the next token, fixed by the seed") {
  const int V = 17, B = 3, T = 5;
  const Microbatch mb = random_microbatch(V, B, T, 1234);
  CHECK(mb.B == B);
  CHECK(mb.T == T);
  REQUIRE(mb.tokens.size() == static_cast<size_t>(B * T));
  REQUIRE(mb.targets.size() == static_cast<size_t>(B * T));
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const size_t k = static_cast<size_t>(b * T + t);
      CHECK(mb.tokens[k] >= 0);
      CHECK(mb.tokens[k] < V);
      CHECK(mb.targets[k] >= 0);
      CHECK(mb.targets[k] < V);
      if (t + 1 < T) CHECK(mb.targets[k] == mb.tokens[k + 1]);
    }
  }
  const Microbatch again = random_microbatch(V, B, T, 1234);
  CHECK(again.tokens == mb.tokens);
  CHECK(again.targets == mb.targets);
  CHECK(random_microbatch(V, B, T, 99).tokens != mb.tokens);
}

TEST_CASE("median") {
  CHECK(median({3.0}) == 3.0);
  CHECK(median({5.0, 1.0, 3.0}) == 3.0);
  CHECK(median({4.0, 1.0, 3.0, 2.0}) == 2.5);
}

TEST_CASE("one configuration: step, floor and profile, and back from JSON") {
  const BenchShape shape = micro_shape();
  auto r = measure_step(shape, 2, Precision::fp32, 3, 1, true);
  REQUIRE(r.ok());
  CHECK(r->step_ms_all.size() == 3);
  CHECK(r->step_ms > 0.0);
  CHECK(r->tokens_per_s == doctest::Approx(256.0 / (r->step_ms / 1000.0)));
  CHECK(r->gflops == doctest::Approx(r->model_flops / (r->step_ms / 1000.0) / 1e9));
  CHECK(r->first_loss == doctest::Approx(std::log(128.0)).epsilon(0.05));  // ≈ ln V at init
  CHECK(r->peak_rss_mb > 1.0);
  REQUIRE(r->floor_ok);
  CHECK(r->floor_note.empty());
  CHECK(r->gemm_calls > 0);
  CHECK(r->floor_ms > 0.0);
  CHECK(r->floor_ratio == doctest::Approx(r->step_ms / r->floor_ms));
  REQUIRE(r->profile.has_value());
  CHECK(r->profile->workers == 1);
  CHECK(r->profile->samples > 0);
  double caller = 0.0;
  for (const auto& row : r->profile->rows) caller += row.caller_ms;
  CHECK(caller == doctest::Approx(r->profile->step_ms));  // shares of the caller's wall time

  const auto j = to_json(*r);
  auto back = step_result_from_json(nlohmann::json::parse(j.dump()));
  REQUIRE(back.ok());
  CHECK(to_json(*back).dump() == j.dump());

  auto bad = nlohmann::json::parse(j.dump());
  bad.erase("floor_ms");
  CHECK_FALSE(step_result_from_json(bad).ok());
}

TEST_CASE("bf16: the floor replays the step's oneDNN products, which the GEMM FLOPs count") {
  if (actorpipe::testing::skip_without_bf16()) return;
  const BenchShape shape = micro_shape();
  auto f = measure_step(shape, 1, Precision::fp32, 2, 1, false);
  auto b = measure_step(shape, 1, Precision::bf16, 2, 1, false);
  REQUIRE(f.ok());
  REQUIRE(b.ok());
  CHECK(b->precision == "bf16");
  REQUIRE(b->floor_ok);
  // the same products, the linear ones now bf16: as many calls and FLOPs as in fp32
  CHECK(b->gemm_calls == f->gemm_calls);
  CHECK(b->gemm_flops == doctest::Approx(f->gemm_flops));
  CHECK(b->floor_ms > 0.0);
  CHECK(b->first_loss == doctest::Approx(f->first_loss).epsilon(0.01));
  CHECK(b->first_loss != f->first_loss);  // rounded products: other bits
}

TEST_CASE("reps and warm-up must be at least 1") {
  CHECK_FALSE(measure_step(micro_shape(), 1, Precision::fp32, 0, 1, false).ok());
  CHECK_FALSE(measure_step(micro_shape(), 1, Precision::fp32, 1, 0, false).ok());
}
