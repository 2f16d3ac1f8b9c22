// bf16 conversions: branch-free loops that the compiler vectorises, so the vector and scalar
// tails round identically.
#include "kernels/bf16.hpp"

namespace actorpipe {

namespace {
// The loops are compiled for AVX-512 as well as the baseline; the loader picks one per CPU.
// (GCC only: clang's target_clones takes other names; sanitizers and ifuncs do not mix)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define AP_BF16_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define AP_BF16_CLONES
#endif

AP_BF16_CLONES void to_bf16_loop(const float* __restrict src, bf16* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
}

AP_BF16_CLONES void to_f32_loop(const bf16* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_f32(src[i]);
}
}  // namespace

void convert_to_bf16(const float* src, bf16* dst, int64_t n) {
  to_bf16_loop(src, dst, n);
}

void convert_to_bf16(Context& ctx, const float* src, bf16* dst, int64_t n) {
  // 64-element chunks keep every thread's stores on whole cache lines
  ctx.parallel_for_aligned(n, 64, [&](int, int64_t b, int64_t e) {
    if (e > b) to_bf16_loop(src + b, dst + b, e - b);
  });
}

void convert_to_f32(const bf16* src, float* dst, int64_t n) {
  to_f32_loop(src, dst, n);
}

bf16* alloc_bf16(Context& ctx, int64_t n) {
  // the arena hands out 64-byte aligned raw memory in floats: two bf16 per float
  return reinterpret_cast<bf16*>(ctx.arena().alloc_f32(static_cast<size_t>((n + 1) / 2)));
}

}  // namespace actorpipe
