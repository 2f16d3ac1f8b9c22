// Token + position (+ segment) embedding: forward over rows, backward over channel slices
// so that every embedding row is summed in (b, t) order whatever the thread count.
#include "kernels/encoder.hpp"

namespace actorpipe {

namespace {
void add2_row(float* __restrict o, const float* __restrict e, const float* __restrict p,
              const int C) {
  for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
}
void add3_row(float* __restrict o, const float* __restrict e, const float* __restrict p,
              const float* __restrict s, const int C) {
  for (int c = 0; c < C; ++c) o[c] = (e[c] + p[c]) + s[c];
}
void acc_row(float* __restrict d, const float* __restrict g, const int64_t n) {
  for (int64_t c = 0; c < n; ++c) d[c] += g[c];
}
}  // namespace

void encoder_forward(Context& ctx, float* out, const int32_t* tokens, const int32_t* segments,
                     const float* wte, const float* wpe, const float* wse, int B, int T, int C) {
  const bool seg = segments != nullptr && wse != nullptr;
  ctx.parallel_for(static_cast<int64_t>(B) * T, [&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* e = wte + static_cast<int64_t>(tokens[r]) * C;
      const float* p = wpe + (r % T) * C;
      if (seg) {
        add3_row(out + r * C, e, p, wse + static_cast<int64_t>(segments[r]) * C, C);
      } else {
        add2_row(out + r * C, e, p, C);
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
      const float* g = dout + r * C + c0;
      acc_row(dwte + static_cast<int64_t>(tokens[r]) * C + c0, g, w);
      acc_row(dwpe + (r % T) * C + c0, g, w);
      if (seg) acc_row(dwse + static_cast<int64_t>(segments[r]) * C + c0, g, w);
    }
  });
}

}  // namespace actorpipe
