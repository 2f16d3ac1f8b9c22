// bf16 conversion tests: round to nearest even at the ties, NaN, infinities, denormals and
// signed zeros; the vectorised loops, threaded or not, equal the scalar rule on every input.
#include "kernels/bf16.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/internal/test_util.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {
float from_bits(uint32_t u) {
  return std::bit_cast<float>(u);
}
}  // namespace

TEST_CASE("to_bf16 rounds to nearest, ties to even") {
  CHECK(to_bf16(1.0f).bits == 0x3f80);
  // 1 + 2^-8 lies half way between 1 and 1 + 2^-7: ties go to the even mantissa (1)
  CHECK(to_bf16(from_bits(0x3f808000u)).bits == 0x3f80);
  // 1 + 3·2^-8 lies half way between 1 + 2^-7 (odd) and 1 + 2^-6: up to the even one
  CHECK(to_bf16(from_bits(0x3f818000u)).bits == 0x3f82);
  // just above and below a tie
  CHECK(to_bf16(from_bits(0x3f808001u)).bits == 0x3f81);
  CHECK(to_bf16(from_bits(0x3f817fffu)).bits == 0x3f81);
  CHECK(to_bf16(-2.5f).bits == 0xc020);
  // rounding up carries into the exponent; the largest finite values round to infinity
  CHECK(to_bf16(from_bits(0x3fffffffu)).bits == 0x4000);
  CHECK(to_bf16(std::numeric_limits<float>::max()).bits == 0x7f80);
  CHECK(to_bf16(std::numeric_limits<float>::infinity()).bits == 0x7f80);
  CHECK(to_bf16(-std::numeric_limits<float>::infinity()).bits == 0xff80);
  CHECK(to_bf16(0.0f).bits == 0x0000);
  CHECK(to_bf16(-0.0f).bits == 0x8000);
  // denormals are kept (rounded like any other value)
  CHECK(to_bf16(from_bits(0x00018000u)).bits == 0x0002);
  CHECK(to_bf16(from_bits(0x00010000u)).bits == 0x0001);
  // NaN stays a quiet NaN of its sign, also one whose payload sits in the dropped bits only
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const float back = to_f32(to_bf16(from_bits(nan)));
    CHECK(std::isnan(back));
    CHECK(std::signbit(back) == std::signbit(from_bits(nan)));
  }
  // round trip of every bf16 value that is not a NaN
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const bf16 v{static_cast<uint16_t>(h)};
    if (std::isnan(to_f32(v))) continue;
    REQUIRE(to_bf16(to_f32(v)) == v);
  }
}

TEST_CASE("the bf16 conversion loops equal the scalar rule, threaded or not") {
  Rng rng(11);
  std::vector<float> src(37 * 140);
  for (size_t i = 0; i < src.size(); ++i) {
    // every 7th a raw bit pattern (ties, denormals, NaN, infinities), the others ordinary values
    src[i] = i % 7 == 0 ? from_bits(static_cast<uint32_t>(rng.next())) : rng.uniform(-3.0f, 3.0f);
  }
  src[5] = from_bits(0x3f808000u);
  const int64_t n = static_cast<int64_t>(src.size());
  std::vector<bf16> serial(src.size()), threaded(src.size());
  convert_to_bf16(src.data(), serial.data(), n);
  Context ctx2(2);
  convert_to_bf16(ctx2, src.data(), threaded.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const bf16 want = to_bf16(src[static_cast<size_t>(i)]);
    REQUIRE_MESSAGE(serial[static_cast<size_t>(i)] == want, "element ", i);
    REQUIRE_MESSAGE(threaded[static_cast<size_t>(i)] == want, "element ", i);
  }
  std::vector<float> back(src.size());
  convert_to_f32(serial.data(), back.data(), n);
  for (int64_t i = 0; i < n; ++i)
    REQUIRE(std::bit_cast<uint32_t>(back[static_cast<size_t>(i)]) ==
            static_cast<uint32_t>(serial[static_cast<size_t>(i)].bits) << 16);
}
