// Multi-head attention through sgemm on strided q/k/v views of the fused qkv buffer, one
// (batch, head) pair per task. The causal case computes only blocks on or below the diagonal.
// In bf16 (ctx.precision()) the same products run through gemm_bf16_serial on a bf16 copy of
// qkv (and of dout), and on each head's probabilities (and their gradient) rounded to bf16 in a
// per-thread scratch; softmax, its backward and every output stay f32.
#include "kernels/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/bf16.hpp"
#include "kernels/bf16_gemm.hpp"
#include "kernels/check.hpp"
#include "kernels/gemm.hpp"
#include "kernels/internal/vecmath.hpp"

namespace actorpipe {

namespace {
constexpr int kQueryBlock = 64;  // query/key block of the causal triangle
using internal::kLanes;

// The row blocks of one head's products: for causal attention blocks [r0, r1) of kQueryBlock query
// rows, each of which needs the keys [0, r1) only; otherwise one block of all T rows and keys.
// fn(r0, r1, keys).
template <class F>
void for_blocks(int T, bool causal, F&& fn) {
  if (!causal) {
    fn(0, T, T);
    return;
  }
  for (int r0 = 0; r0 < T; r0 += kQueryBlock) {
    const int r1 = std::min(T, r0 + kQueryBlock);
    fn(r0, r1, r1);
  }
}

// The end of query row t's block: the blocked products read a row of the probabilities (or of
// their gradient) up to there, no further (causal); T otherwise.
int block_end(int t, int T, bool causal) {
  return causal ? std::min(T, (t / kQueryBlock + 1) * kQueryBlock) : T;
}

// Softmax of row[0, nv) over the keys allowed by km (null = all); row[nv, T) and masked
// entries become 0, as does a row without any allowed key. The loops run over whole groups
// of kLanes lanes up to n = min(T, nv rounded up), the entries past nv set to -inf first: they
// add exact zeros to the lane sums, so the bits are those of a loop over nv.
void softmax_row(float* __restrict row, const uint8_t* __restrict km, const int nv, const int T) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const int n = std::min(T, (nv + kLanes - 1) / kLanes * kLanes);
  if (km != nullptr)
    for (int j = 0; j < nv; ++j) row[j] = km[j] != 0 ? row[j] : ninf;
  for (int j = nv; j < n; ++j) row[j] = ninf;
  const float mx = nv > 0 ? internal::lane_max(row, n) : ninf;
  if (mx == ninf) {
    std::memset(row, 0, sizeof(float) * static_cast<size_t>(T));
    return;
  }
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float e = internal::exp_f32(row[j + l] - mx);
      row[j + l] = e;
      acc[l] += e;
    }
  for (int l = 0; j + l < n; ++l) {
    const float e = internal::exp_f32(row[j + l] - mx);
    row[j + l] = e;
    acc[l] += e;
  }
  float sum = 0.0f;
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  const float inv = 1.0f / sum;
  for (int jj = 0; jj < n; ++jj) row[jj] *= inv;
  for (int jj = n; jj < T; ++jj) row[jj] = 0.0f;
}

// d[0, nv) = a ⊙ (d − Σ a·d) · scale and d[nv, end) = 0. a[nv, n) is 0 and d[nv, n) is
// finite, so the loops run over [0, n) without tails (0·d adds exact zeros to the lanes).
void softmax_backward_row(float* __restrict d, const float* __restrict a, const float scale,
                          const int n, const int end) {
  const float dot = internal::lane_dot(a, d, n);
  for (int j = 0; j < n; ++j) d[j] = a[j] * (d[j] - dot) * scale;
  for (int j = n; j < end; ++j) d[j] = 0.0f;
}

// S (T × T, row stride T) = x · yᵀ for one head's rows of x and y (T × hs, row strides ldx, ldy):
// both copied into contiguous xh and yh (T × hs) first, and every row whole, also above a causal
// diagonal (the softmax ignores those entries; of the backward's gradient the blocked products
// read a row only up to its block's end). oneDNN runs its brgemm (AMX) kernels on contiguous
// operands and a slower one on the strided views: a GPT-small head's scores in 23 µs instead of
// 48 µs as causal blocks (docs/benchmarks.md).
void scores_bf16(float* S, bf16* xh, bf16* yh, const bf16* x, int ldx, const bf16* y, int ldy,
                 int T, int hs) {
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(xh + t * hs, x + t * ldx, sizeof(bf16) * static_cast<size_t>(hs));
    std::memcpy(yh + t * hs, y + t * ldy, sizeof(bf16) * static_cast<size_t>(hs));
  }
  gemm_bf16_serial(false, true, T, T, hs, xh, hs, yh, hs, false, S, T);
}

// The bf16 forward: the fp32 one's loops with bf16 operands. The scores come unscaled out of the
// product (gemm_bf16 has no alpha) and are scaled in f32 before the softmax.
void attention_forward_bf16(Context& ctx, float* out, float* att, const bf16* qkv16,
                            const uint8_t* key_mask, bool causal, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t TT = static_cast<int64_t>(T) * T;
  const int64_t Thd = static_cast<int64_t>(T) * hs;
  bf16* a16_all = alloc_bf16(ctx, ctx.threads() * TT);
  bf16* qk_all = alloc_bf16(ctx, ctx.threads() * 2 * Thd);
  ctx.parallel_tasks(static_cast<int64_t>(B) * NH, [&](int chunk, int64_t bh) {
    bf16* a16 = a16_all + chunk * TT;
    bf16* qh = qk_all + chunk * 2 * Thd;
    bf16* kh = qh + Thd;
    const int64_t b = bh / NH;
    const int64_t h = bh % NH;
    const bf16* q = qkv16 + b * T * C3 + h * hs;
    const bf16* k = q + C;
    const bf16* v = q + 2 * C;
    float* A = att + bh * TT;
    float* o = out + b * T * C + h * hs;
    const uint8_t* km = key_mask != nullptr ? key_mask + b * T : nullptr;
    scores_bf16(A, qh, kh, q, C3, k, C3, T, hs);
    for (int t = 0; t < T; ++t) {
      float* row = A + static_cast<int64_t>(t) * T;
      const int nv = causal ? t + 1 : T;
      for (int j = 0; j < nv; ++j) row[j] *= scale;
      softmax_row(row, km, nv, T);
      // rounded while in cache, as far as the products below read the row
      convert_to_bf16(row, a16 + static_cast<int64_t>(t) * T, block_end(t, T, causal));
    }
    for_blocks(T, causal, [&](int r0, int r1, int keys) {
      gemm_bf16_serial(false, false, r1 - r0, hs, keys, a16 + static_cast<int64_t>(r0) * T, T, v,
                       C3, false, o + static_cast<int64_t>(r0) * C, C);
    });
  });
}

// The bf16 backward: the fp32 one's loops with bf16 operands; D (the scores' gradient) is
// computed and differentiated through the softmax in f32, then rounded for its two products.
void attention_backward_bf16(Context& ctx, float* dqkv, float* scratch, const float* dout,
                             const bf16* qkv16, const float* att, int B, int T, int C, int NH,
                             bool causal) {
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t TT = static_cast<int64_t>(T) * T;
  bf16* go16_all = alloc_bf16(ctx, static_cast<int64_t>(B) * T * C);
  convert_to_bf16(ctx, dout, go16_all, static_cast<int64_t>(B) * T * C);
  bf16* a16_all = alloc_bf16(ctx, ctx.threads() * TT);
  bf16* d16_all = alloc_bf16(ctx, ctx.threads() * TT);
  const int64_t Thd = static_cast<int64_t>(T) * hs;
  bf16* gv_all = alloc_bf16(ctx, ctx.threads() * 2 * Thd);
  ctx.parallel_tasks(static_cast<int64_t>(B) * NH, [&](int chunk, int64_t bh) {
    float* D = scratch + chunk * TT;
    bf16* a16 = a16_all + chunk * TT;
    bf16* d16 = d16_all + chunk * TT;
    bf16* gh = gv_all + chunk * 2 * Thd;
    bf16* vh = gh + Thd;
    const int64_t b = bh / NH;
    const int64_t h = bh % NH;
    const int64_t base = b * T * C3 + h * hs;
    const bf16* q = qkv16 + base;
    const bf16* k = q + C;
    const bf16* v = q + 2 * C;
    float* dq = dqkv + base;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* A = att + bh * TT;
    const bf16* go = go16_all + b * T * C + h * hs;
    for (int t = 0; t < T; ++t)  // as far as the dv products read each row
      convert_to_bf16(A + static_cast<int64_t>(t) * T, a16 + static_cast<int64_t>(t) * T,
                      block_end(t, T, causal));
    scores_bf16(D, gh, vh, go, C, v, C3, T, hs);  // dA = dout · vᵀ, every row whole
    for_blocks(T, causal, [&](int r0, int r1, int) {
      const int64_t o0 = r0;
      gemm_bf16_serial(true, false, r1 - r0, hs, T - r0, a16 + o0 * T + o0, T, go + o0 * C, C, true,
                       dv + o0 * C3, C3);
    });
    for (int t = 0; t < T; ++t) {
      const int n = causal ? std::min(T, (t + kLanes) / kLanes * kLanes) : T;
      const int end = block_end(t, T, causal);
      softmax_backward_row(D + static_cast<int64_t>(t) * T, A + static_cast<int64_t>(t) * T, scale,
                           n, end);
      // the products below read each row up to `end` only
      convert_to_bf16(D + static_cast<int64_t>(t) * T, d16 + static_cast<int64_t>(t) * T, end);
    }
    for_blocks(T, causal, [&](int r0, int r1, int keys) {
      const int64_t o0 = r0;
      gemm_bf16_serial(false, false, r1 - r0, hs, keys, d16 + o0 * T, T, k, C3, true, dq + o0 * C3,
                       C3);
      gemm_bf16_serial(true, false, r1 - r0, hs, T - r0, d16 + o0 * T + o0, T, q + o0 * C3, C3,
                       true, dk + o0 * C3, C3);
    });
  });
}
// qkv's bf16 rounding in the Context's scratch: the operand the bf16 products read.
const bf16* rounded_qkv(Context& ctx, const float* qkv, int B, int T, int C) {
  const int64_t n = static_cast<int64_t>(B) * T * 3 * C;
  bf16* qkv16 = alloc_bf16(ctx, n);
  convert_to_bf16(ctx, qkv, qkv16, n);
  return qkv16;
}

void check_heads(int C, int NH) {
  AP_CHECK(NH > 0 && C % NH == 0, "attention: C={} not divisible by NH={}", C, NH);
}
}  // namespace

void attention_forward(Context& ctx, float* out, float* att, const bf16* qkv,
                       const uint8_t* key_mask, bool causal, int B, int T, int C, int NH) {
  check_heads(C, NH);
  AP_CHECK(ctx.precision() == Precision::bf16,
           "attention_forward: a bf16 qkv on a Context computing in {}",
           to_string(ctx.precision()));
  attention_forward_bf16(ctx, out, att, qkv, key_mask, causal, B, T, C, NH);
}

void attention_backward(Context& ctx, float* dqkv, float* scratch, const float* dout,
                        const bf16* qkv, const float* att, int B, int T, int C, int NH,
                        bool causal) {
  check_heads(C, NH);
  AP_CHECK(ctx.precision() == Precision::bf16,
           "attention_backward: a bf16 qkv on a Context computing in {}",
           to_string(ctx.precision()));
  attention_backward_bf16(ctx, dqkv, scratch, dout, qkv, att, B, T, C, NH, causal);
}

void attention_forward(Context& ctx, float* out, float* att, const float* qkv,
                       const uint8_t* key_mask, bool causal, int B, int T, int C, int NH) {
  check_heads(C, NH);
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t TT = static_cast<int64_t>(T) * T;
  if (ctx.precision() == Precision::bf16) {
    attention_forward_bf16(ctx, out, att, rounded_qkv(ctx, qkv, B, T, C), key_mask, causal, B, T, C,
                           NH);
    return;
  }
  ctx.parallel_tasks(static_cast<int64_t>(B) * NH, [&](int, int64_t bh) {
    const int64_t b = bh / NH;
    const int64_t h = bh % NH;
    const float* q = qkv + b * T * C3 + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* A = att + bh * TT;
    float* o = out + b * T * C + h * hs;
    const uint8_t* km = key_mask != nullptr ? key_mask + b * T : nullptr;
    // Scores.
    for_blocks(T, causal, [&](int r0, int r1, int keys) {
      gemm_serial(false, true, r1 - r0, keys, hs, scale, q + static_cast<int64_t>(r0) * C3, C3, k,
                  C3, 0.0f, A + static_cast<int64_t>(r0) * T, T);
    });
    // Softmax over the valid keys of each row; invalid entries become 0.
    for (int t = 0; t < T; ++t)
      softmax_row(A + static_cast<int64_t>(t) * T, km, causal ? t + 1 : T, T);
    // out_h = att · v.
    for_blocks(T, causal, [&](int r0, int r1, int keys) {
      gemm_serial(false, false, r1 - r0, hs, keys, 1.0f, A + static_cast<int64_t>(r0) * T, T, v, C3,
                  0.0f, o + static_cast<int64_t>(r0) * C, C);
    });
  });
}

void attention_backward(Context& ctx, float* dqkv, float* scratch, const float* dout,
                        const float* qkv, const float* att, int B, int T, int C, int NH,
                        bool causal) {
  check_heads(C, NH);
  const int hs = C / NH;
  const int C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t TT = static_cast<int64_t>(T) * T;
  if (ctx.precision() == Precision::bf16) {
    attention_backward_bf16(ctx, dqkv, scratch, dout, rounded_qkv(ctx, qkv, B, T, C), att, B, T, C,
                            NH, causal);
    return;
  }
  ctx.parallel_tasks(static_cast<int64_t>(B) * NH, [&](int chunk, int64_t bh) {
    float* D = scratch + chunk * TT;
    const int64_t b = bh / NH;
    const int64_t h = bh % NH;
    const int64_t base = b * T * C3 + h * hs;
    const float* q = qkv + base;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + base;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* A = att + bh * TT;
    const float* go = dout + b * T * C + h * hs;
    for_blocks(T, causal, [&](int r0, int r1, int keys) {
      const int64_t o0 = r0;
      // datt rows [r0, r1), keys [0, keys).
      gemm_serial(false, true, r1 - r0, keys, hs, 1.0f, go + o0 * C, C, v, C3, 0.0f, D + o0 * T, T);
      // dv[keys r0..r1) += att[queries r0..T, keys r0..r1)ᵀ · dout[queries r0..T).
      gemm_serial(true, false, r1 - r0, hs, T - r0, 1.0f, A + o0 * T + o0, T, go + o0 * C, C, 1.0f,
                  dv + o0 * C3, C3);
    });
    // Softmax backward, scale folded in: D = att ⊙ (datt − Σ att·datt) · scale. In the
    // causal case the entries right of the diagonal up to the block end are zeroed, as
    // the blocked GEMMs below read them.
    for (int t = 0; t < T; ++t) {
      const int n = causal ? std::min(T, (t + kLanes) / kLanes * kLanes) : T;  // t + 1 rounded up
      const int end = block_end(t, T, causal);
      softmax_backward_row(D + static_cast<int64_t>(t) * T, A + static_cast<int64_t>(t) * T, scale,
                           n, end);
    }
    for_blocks(T, causal, [&](int r0, int r1, int keys) {
      const int64_t o0 = r0;
      // dq[rows r0..r1) += D[rows, keys 0..keys) · k[keys 0..keys).
      gemm_serial(false, false, r1 - r0, hs, keys, 1.0f, D + o0 * T, T, k, C3, 1.0f, dq + o0 * C3,
                  C3);
      // dk[keys r0..r1) += D[queries r0..T, keys r0..r1)ᵀ · q[queries r0..T).
      gemm_serial(true, false, r1 - r0, hs, T - r0, 1.0f, D + o0 * T + o0, T, q + o0 * C3, C3, 1.0f,
                  dk + o0 * C3, C3);
    });
  });
}

}  // namespace actorpipe
