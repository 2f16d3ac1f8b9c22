// Element-wise helpers: plain restrict loops over 16-aligned chunks (vectorised by gcc).
#include "kernels/elementwise.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "kernels/internal/vecmath.hpp"

namespace actorpipe {

namespace {
using internal::kAlignElems;

// out may alias a or b: element i reads a[i], b[i] before writing out[i], so no restrict.
void add_range(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
void add2_range(float* __restrict da, float* __restrict db, const float* __restrict g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    da[i] += g[i];
    db[i] += g[i];
  }
}
void acc_range(float* __restrict d, const float* __restrict s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] += s[i];
}
void scale_range(float* __restrict d, const float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] *= s;
}
}  // namespace

void residual_forward(Context& ctx, float* out, const float* a, const float* b, long N) {
  ctx.parallel_for_aligned(N, kAlignElems, [&](int, int64_t i0, int64_t i1) {
    // In place: a plain restrict loop (IEEE addition commutes, so the bits are the same).
    if (out == a) {
      acc_range(out + i0, b + i0, i1 - i0);
    } else if (out == b) {
      acc_range(out + i0, a + i0, i1 - i0);
    } else {
      add_range(out + i0, a + i0, b + i0, i1 - i0);
    }
  });
}

void residual_backward(Context& ctx, float* da, float* db, const float* dout, long N) {
  ctx.parallel_for_aligned(N, kAlignElems, [&](int, int64_t i0, int64_t i1) {
    add2_range(da + i0, db + i0, dout + i0, i1 - i0);
  });
}

void accumulate(Context& ctx, float* dst, const float* src, long N) {
  ctx.parallel_for_aligned(
      N, kAlignElems, [&](int, int64_t i0, int64_t i1) { acc_range(dst + i0, src + i0, i1 - i0); });
}

void fill_zero(Context& ctx, float* dst, long N) {
  ctx.parallel_for_aligned(N, kAlignElems, [&](int, int64_t i0, int64_t i1) {
    std::memset(dst + i0, 0, static_cast<size_t>(i1 - i0) * sizeof(float));
  });
}

void scale_inplace(Context& ctx, float* dst, float s, long N) {
  ctx.parallel_for_aligned(N, kAlignElems,
                           [&](int, int64_t i0, int64_t i1) { scale_range(dst + i0, s, i1 - i0); });
}

void gather_rows(Context& ctx, float* out, const float* x, const int32_t* rows, int n, int C) {
  ctx.parallel_for(n, [&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      std::copy_n(x + static_cast<size_t>(rows[r]) * C, C, out + r * C);
  });
}

void scatter_rows(Context& ctx, float* out, const float* x, const int32_t* rows, int n, int C) {
  ctx.parallel_for(n, [&](int, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      std::copy_n(x + r * C, C, out + static_cast<size_t>(rows[r]) * C);
  });
}

}  // namespace actorpipe
