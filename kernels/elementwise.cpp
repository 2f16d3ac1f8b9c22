// Element-wise helpers: plain restrict loops over 16-aligned chunks (vectorised by gcc).
#include "kernels/elementwise.hpp"

#include <cstring>

namespace actorpipe {

namespace {
constexpr int64_t kAlignElems = 16;  // one cache line of floats per chunk boundary
}

void residual_forward(Context& ctx, float* out, const float* a, const float* b, long N) {
  ctx.parallel_for_aligned(N, kAlignElems, [&](int, int64_t i0, int64_t i1) {
    // out may alias a or b: element i reads a[i], b[i] before writing out[i].
    for (int64_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
  });
}

void residual_backward(Context& ctx, float* da, float* db, const float* dout, long N) {
  ctx.parallel_for_aligned(N, kAlignElems, [&](int, int64_t i0, int64_t i1) {
    float* __restrict pa = da;
    float* __restrict pb = db;
    const float* __restrict g = dout;
    for (int64_t i = i0; i < i1; ++i) {
      pa[i] += g[i];
      pb[i] += g[i];
    }
  });
}

void accumulate(Context& ctx, float* dst, const float* src, long N) {
  ctx.parallel_for_aligned(N, kAlignElems, [&](int, int64_t i0, int64_t i1) {
    float* __restrict d = dst;
    const float* __restrict s = src;
    for (int64_t i = i0; i < i1; ++i) d[i] += s[i];
  });
}

void fill_zero(Context& ctx, float* dst, long N) {
  ctx.parallel_for_aligned(N, kAlignElems, [&](int, int64_t i0, int64_t i1) {
    std::memset(dst + i0, 0, static_cast<size_t>(i1 - i0) * sizeof(float));
  });
}

void scale_inplace(Context& ctx, float* dst, float s, long N) {
  ctx.parallel_for_aligned(N, kAlignElems, [&](int, int64_t i0, int64_t i1) {
    float* __restrict d = dst;
    for (int64_t i = i0; i < i1; ++i) d[i] *= s;
  });
}

}  // namespace actorpipe
