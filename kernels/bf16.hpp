// bf16: the 16-bit brain float (f32's sign and 8-bit exponent, 7 stored mantissa bits) as raw
// bits, and the conversions between it and f32. f32 -> bf16 rounds to nearest, ties to even, the
// rounding of the hardware's VCVTNEPS2BF16 and of oneDNN's reorders (denormals kept, NaN stays a
// quiet NaN of the same sign); bf16 -> f32 is exact.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/context.hpp"

namespace actorpipe {

/// One bf16 value: the upper 16 bits of the f32 it rounds.
struct bf16 {
  uint16_t bits = 0;
  friend bool operator==(bf16, bf16) = default;
};
static_assert(sizeof(bf16) == 2);

/// f32 -> bf16, round to nearest even.
inline bf16 to_bf16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

/// bf16 -> f32 (exact).
inline float to_f32(bf16 h) {
  const uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f = 0.0f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// f32 rounded to bf16 and back: the value a bf16 product sees.
inline float round_bf16(float f) {
  return to_f32(to_bf16(f));
}

/// dst[i] = to_bf16(src[i]) for i < n.
void convert_to_bf16(const float* src, bf16* dst, int64_t n);
/// The same over the Context's threads (same bits for any thread count).
void convert_to_bf16(Context& ctx, const float* src, bf16* dst, int64_t n);

/// dst[i] = to_f32(src[i]) for i < n.
void convert_to_f32(const bf16* src, float* dst, int64_t n);

/// `n` bf16 values of scratch from the Context's arena (64-byte aligned; dead at its reset).
bf16* alloc_bf16(Context& ctx, int64_t n);

}  // namespace actorpipe
