// update bench tests: a tiny configuration measures both ways, and both ways leave the same
// weights and optimizer state; bad input is named.
#include "bench/update_bench.hpp"

#include <doctest/doctest.h>

#include "kernels/bf16_gemm.hpp"

using namespace actorpipe;
using namespace actorpipe::bench;

TEST_CASE("update bench: the fused and the separate passes, timed, with the same bits") {
  std::vector<std::string> precisions{"fp32"};
  if (bf16_support().native) precisions.push_back("bf16");
  for (const std::string& precision : precisions) {
    CAPTURE(precision);
    auto t = time_update("tiny", 2, precision, 3);
    REQUIRE_MESSAGE(t.ok(), (t.ok() ? "" : t.error().message));
    CHECK(t->shape == "tiny");
    CHECK(t->parameters > 0);
    REQUIRE(t->separate_ms.size() == 3);
    REQUIRE(t->fused_ms.size() == 3);
    for (size_t i = 0; i < 3; ++i) {
      CHECK(t->separate_ms[i] > 0.0);
      CHECK(t->fused_ms[i] > 0.0);
    }
    CHECK(t->same_bits);
  }
}

TEST_CASE("update bench: an unknown shape, precision or repetition count is named") {
  auto shape = time_update("huge", 1, "fp32", 1);
  REQUIRE(!shape.ok());
  CHECK(shape.error().message.find("huge") != std::string::npos);
  auto precision = time_update("tiny", 1, "fp8", 1);
  REQUIRE(!precision.ok());
  CHECK(precision.error().message.find("fp8") != std::string::npos);
  auto reps = time_update("tiny", 1, "fp32", 0);
  REQUIRE(!reps.ok());
  CHECK(reps.error().message.find("--reps 0") != std::string::npos);
}
