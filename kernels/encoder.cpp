// Token + position (+ segment) embedding: forward over rows, backward over channel slices
// so that every embedding row is summed in (b, t) order whatever the thread count.
#include "kernels/encoder.hpp"

namespace actorpipe {

void encoder_forward(Context& ctx, float* out, const int32_t* tokens, const int32_t* segments,
                     const float* wte, const float* wpe, const float* wse, int B, int T, int C) {
  const bool seg = segments != nullptr && wse != nullptr;
  ctx.parallel_for(static_cast<int64_t>(B) * T, [&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % T;
      float* __restrict o = out + r * C;
      const float* __restrict e = wte + static_cast<int64_t>(tokens[r]) * C;
      const float* __restrict p = wpe + t * C;
      if (seg) {
        const float* __restrict s = wse + static_cast<int64_t>(segments[r]) * C;
        for (int c = 0; c < C; ++c) o[c] = (e[c] + p[c]) + s[c];
      } else {
        for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
      }
    }
  });
}

void encoder_backward(Context& ctx, float* dwte, float* dwpe, float* dwse, const float* dout,
                      const int32_t* tokens, const int32_t* segments, int B, int T, int C) {
  const bool seg = segments != nullptr && dwse != nullptr;
  ctx.parallel_for_aligned(C, 16, [&](int, int64_t c0, int64_t c1) {
    if (c0 == c1) return;
    const int64_t w = c1 - c0;
    for (int64_t r = 0; r < static_cast<int64_t>(B) * T; ++r) {
      const int64_t t = r % T;
      const float* __restrict g = dout + r * C + c0;
      float* __restrict de = dwte + static_cast<int64_t>(tokens[r]) * C + c0;
      for (int64_t c = 0; c < w; ++c) de[c] += g[c];
      float* __restrict dp = dwpe + t * C + c0;
      for (int64_t c = 0; c < w; ++c) dp[c] += g[c];
      if (seg) {
        float* __restrict ds = dwse + static_cast<int64_t>(segments[r]) * C + c0;
        for (int64_t c = 0; c < w; ++c) ds[c] += g[c];
      }
    }
  });
}

}  // namespace actorpipe
