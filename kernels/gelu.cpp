// GELU (tanh approximation) forward and backward with a vectorised tanh.
#include "kernels/gelu.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/internal/vecmath.hpp"

namespace actorpipe {

namespace {
constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kC = 0.044715f;
using internal::kAlignElems;

void gelu_range(float* __restrict out, const float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float u = kS * std::fma(kC * xi, xi * xi, xi);
    out[i] = 0.5f * xi * (1.0f + internal::tanh_f32(u));
  }
}

void gelu_backward_range(float* __restrict dx, const float* __restrict x, const float* __restrict g,
                         int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float x2 = xi * xi;
    const float u = kS * std::fma(kC * xi, x2, xi);
    const float th = internal::tanh_f32(u);
    const float sech2 = std::fma(-th, th, 1.0f);
    const float du = kS * std::fma(3.0f * kC, x2, 1.0f);
    const float grad = std::fma(0.5f * xi * sech2, du, 0.5f * (1.0f + th));
    dx[i] = std::fma(grad, g[i], dx[i]);
  }
}
void add_range(float* __restrict acc, const float* __restrict v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += v[i];
}
}  // namespace

void gelu_forward(Context& ctx, float* out, const float* inp, long N) {
  ctx.parallel_for_aligned(N, kAlignElems, [&](int, int64_t i0, int64_t i1) {
    gelu_range(out + i0, inp + i0, i1 - i0);
  });
}

void gelu_forward(Context& ctx, bf16* out, const float* inp, long N) {
  ctx.parallel_for_aligned(N, kAlignElems, [&](int, int64_t i0, int64_t i1) {
    // through a block on the stack: f32 values, then rounded
    constexpr int64_t kBlock = 256;
    float block[kBlock];
    for (int64_t i = i0; i < i1; i += kBlock) {
      const int64_t n = std::min(kBlock, i1 - i);
      gelu_range(block, inp + i, n);
      convert_to_bf16(block, out + i, n);
    }
  });
}

void gelu_backward(Context& ctx, float* dinp, const float* inp, const float* dout, long N) {
  ctx.parallel_for_aligned(N, kAlignElems, [&](int, int64_t i0, int64_t i1) {
    gelu_backward_range(dinp + i0, inp + i0, dout + i0, i1 - i0);
  });
}

void gelu_backward(Context& ctx, bf16* dinp, float* dbias, const float* inp, const float* dout,
                   int rows, int cols) {
  // per column slice (bias_backward's partition), rows in order, through a block on the stack
  ctx.parallel_for_aligned(cols, kAlignElems, [&](int, int64_t o0, int64_t o1) {
    constexpr int64_t kBlock = 256;
    float block[kBlock];
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = o0; o < o1; o += kBlock) {
        const int64_t n = std::min(kBlock, o1 - o);
        const int64_t at = r * cols + o;
        std::fill_n(block, n, 0.0f);
        gelu_backward_range(block, inp + at, dout + at, n);
        add_range(dbias + o, block, n);
        convert_to_bf16(block, dinp + at, n);
      }
  });
}

}  // namespace actorpipe
