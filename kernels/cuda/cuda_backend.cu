// The CUDA backend (kernels/cuda/cuda_backend.hpp): kernels/compute_backend.hpp on one GPU, one
// non-blocking stream and one cuBLAS handle bound to it; every kernel, copy and product of the
// backend goes on that stream.
//
// Each op computes what the CPU kernel of the same name computes (kernels/*.cpp), with the same
// per-element expressions: explicit fmaf where the CPU writes std::fma, and the _rn intrinsics
// elsewhere so that nvcc cannot contract a product and a sum into an FMA the CPU does not do
// (the CPU kernels build with -ffp-contract=off). Matrix products go through cuBLAS in full fp32
// (CUBLAS_DEFAULT_MATH: no TF32), so they round differently from the CPU's GEMM.
//
// Deterministic: no kernel adds floats atomically, and every reduction has a fixed order that
// does not depend on timing. Where the CPU order can be reproduced it is:
//  - row reductions (layernorm statistics, softmax, cross-entropy) use the CPU's 16 lanes
//    (internal::kLanes): 16 threads per row, thread j accumulating elements j, j+16, ... in
//    order, the lanes then added in order 0..15 (shuffles);
//  - column reductions (bias and layernorm parameter gradients, position embeddings) run one
//    thread per column over the rows in order, from the value already there;
//  - token / segment embedding rows are summed in (b, t) order by one thread per (row, channel)
//    over the positions of that id, grouped on the host by a stable sort;
//  - grad_sumsq uses the CPU's blocks of 16384 elements with 8 double lanes, the blocks' partial
//    sums added on the host in block order.
// cuBLAS repeats its bits run to run on the same GPU with one handle per stream and its own
// workspace, which is what this backend has.
//
// Index arrays (tokens, segments, targets, rows, key mask) arrive in host memory: they are copied
// into a pinned ring slot and from there, on the stream, into a device staging buffer (see
// stage()), so the caller may free or change them as soon as a call returns.

// fmt disables its constexpr support under nvcc (__NVCC__), which breaks its compile-time format
// checks in C++20 (kernels/check.hpp); nvcc 12+ handles them, so turn it back on.
#ifndef FMT_USE_CONSTEXPR
#define FMT_USE_CONSTEXPR 1
#endif

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/check.hpp"
#include "kernels/crossentropy.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/internal/vecmath.hpp"

namespace actorpipe {
namespace {

// ---- errors -------------------------------------------------------------------------------------

void cuda_ok(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so that the next check does not see it again
  check_failed(file, line, call,
               fmt::format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e)));
}

void cublas_ok(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  check_failed(file, line, call,
               fmt::format("{} ({})", cublasGetStatusString(s), cublasGetStatusName(s)));
}

#define AP_CUDA(call) cuda_ok((call), #call, __FILE__, __LINE__)
#define AP_CUBLAS(call) cublas_ok((call), #call, __FILE__, __LINE__)
// After a kernel launch: a bad configuration (or an earlier asynchronous fault) as a CheckFailure.
#define AP_LAUNCHED(kernel) cuda_ok(cudaGetLastError(), "launch of " #kernel, __FILE__, __LINE__)

// ---- constants and launch helpers ---------------------------------------------------------------

constexpr int kThreads = 256;  // block of the element-wise and per-column kernels
constexpr int kLanes = 16;     // lanes of the CPU's fixed-order row reductions
static_assert(kLanes == internal::kLanes, "the row kernels reproduce the CPU's lane order");
constexpr int kRowThreads = 128;                     // block of the per-row kernels:
constexpr int kRowsPerBlock = kRowThreads / kLanes;  // 8 rows of 16 lanes
constexpr int kUnroll = 8;  // loads in flight per serial sum (the adds stay in order)
constexpr int64_t kSumBlock = int64_t{1} << 14;  // grad_sumsq: elements per block (as CPU)
constexpr int kDLanes = 8;                       // grad_sumsq: double lanes per block
constexpr size_t kAlign = 256;                   // scratch and staging alignment (bytes)
constexpr size_t kMinScratchBlock = size_t{16} << 20;
constexpr size_t kCublasWorkspace = size_t{32} << 20;
constexpr float kLnEps = 1e-5f;                // layernorm.cpp
constexpr float kDcEps = 1e-8f;                // optimizer.cpp: SGD's dc
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi), gelu.cpp
constexpr float kGeluC = 0.044715f;

size_t round_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}
int64_t cdiv(int64_t n, int64_t d) {
  return (n + d - 1) / d;
}

// Blocks of a grid-stride loop over n elements (capped; the loop covers the rest).
unsigned grid_stride_blocks(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>(cdiv(n, kThreads), 1, int64_t{1} << 18));
}
// Blocks of one thread per element (per column), kThreads a block.
unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(cdiv(n, kThreads));
}
// Blocks of the per-row kernels (kRowsPerBlock rows a block).
unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(cdiv(rows, kRowsPerBlock));
}

#define GRID_STRIDE(i, n)                                                                \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ---- device helpers -----------------------------------------------------------------------------

// internal::exp_f32 operation for operation (the same bits): softmax and GELU's tanh.
__device__ __forceinline__ float exp_f32(float x) {
  const float xc = x < -87.3f ? -87.3f : (x > 88.37f ? 88.37f : x);
  const float shifter = 12582912.0f;
  const float t = fmaf(xc, 1.44269504088896341f, shifter);
  const float n = __fsub_rn(t, shifter);
  float r = fmaf(n, -0.693359375f, xc);
  r = fmaf(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  p = fmaf(p, __fmul_rn(r, r), __fadd_rn(r, 1.0f));
  const int e = (static_cast<int>(n) + 127) << 23;
  const float y = __fmul_rn(p, __int_as_float(e));
  return x < -87.3f ? 0.0f : y;
}

// internal::tanh_f32.
__device__ __forceinline__ float tanh_f32(float x) {
  return __fsub_rn(1.0f, __fdiv_rn(2.0f, __fadd_rn(exp_f32(__fmul_rn(2.0f, x)), 1.0f)));
}

// The mask of this thread's 16-lane group (half a warp; blocks are whole warps).
__device__ __forceinline__ unsigned lane_group_mask() {
  return 0xffffu << (threadIdx.x & 16u);
}

// Σ of the 16 lanes' accumulators in lane order 0..15, as internal::lane_sum adds its lanes.
__device__ __forceinline__ float lanes_sum(float acc, unsigned mask) {
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < kLanes; ++j) s = __fadd_rn(s, __shfl_sync(mask, acc, j, kLanes));
  return s;
}

// max over the 16 lanes (a max does not depend on the order).
__device__ __forceinline__ float lanes_max(float acc, unsigned mask) {
#pragma unroll
  for (int off = kLanes / 2; off > 0; off /= 2) {
    const float o = __shfl_xor_sync(mask, acc, off, kLanes);
    acc = o > acc ? o : acc;
  }
  return acc;
}

// ---- element-wise kernels (elementwise.cpp, gelu.cpp) -------------------------------------------

// out = a + b; out may alias a or b (each element read before it is written).
__global__ void k_residual_forward(float* out, const float* a, const float* b, int64_t n) {
  GRID_STRIDE(i, n) out[i] = __fadd_rn(a[i], b[i]);
}

// da += g, db += g.
__global__ void k_residual_backward(float* __restrict__ da, float* __restrict__ db,
                                    const float* __restrict__ g, int64_t n) {
  GRID_STRIDE(i, n) {
    da[i] = __fadd_rn(da[i], g[i]);
    db[i] = __fadd_rn(db[i], g[i]);
  }
}

// dst += src.
__global__ void k_accumulate(float* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  GRID_STRIDE(i, n) dst[i] = __fadd_rn(dst[i], src[i]);
}

// dst *= s.
__global__ void k_scale(float* __restrict__ dst, float s, int64_t n) {
  GRID_STRIDE(i, n) dst[i] = __fmul_rn(dst[i], s);
}

// out = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), gelu_range's expression.
__global__ void k_gelu_forward(float* __restrict__ out, const float* __restrict__ inp, int64_t n) {
  GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float u = __fmul_rn(kGeluS, fmaf(__fmul_rn(kGeluC, x), __fmul_rn(x, x), x));
    out[i] = __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanh_f32(u)));
  }
}

// dinp += gelu'(inp)·dout, gelu_backward_range's expression.
__global__ void k_gelu_backward(float* __restrict__ dinp, const float* __restrict__ inp,
                                const float* __restrict__ dout, int64_t n) {
  GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float x2 = __fmul_rn(x, x);
    const float u = __fmul_rn(kGeluS, fmaf(__fmul_rn(kGeluC, x), x2, x));
    const float th = tanh_f32(u);
    const float sech2 = fmaf(-th, th, 1.0f);
    const float du = __fmul_rn(kGeluS, fmaf(3.0f * kGeluC, x2, 1.0f));
    const float grad =
        fmaf(__fmul_rn(__fmul_rn(0.5f, x), sech2), du, __fmul_rn(0.5f, __fadd_rn(1.0f, th)));
    dinp[i] = fmaf(grad, dout[i], dinp[i]);
  }
}

// out row r = x row rows[r] (gather) or out row rows[r] = x row r (scatter); C columns.
__global__ void k_gather_rows(float* __restrict__ out, const float* __restrict__ x,
                              const int32_t* __restrict__ rows, int64_t n, int C) {
  GRID_STRIDE(i, n * C) {
    const int64_t r = i / C, c = i % C;
    out[i] = x[static_cast<int64_t>(rows[r]) * C + c];
  }
}
__global__ void k_scatter_rows(float* __restrict__ out, const float* __restrict__ x,
                               const int32_t* __restrict__ rows, int64_t n, int C) {
  GRID_STRIDE(i, n * C) {
    const int64_t r = i / C, c = i % C;
    out[static_cast<int64_t>(rows[r]) * C + c] = x[i];
  }
}

// ---- linear layer (matmul.cpp) ------------------------------------------------------------------

// out (N,OC) rows = bias: the GEMM then accumulates onto it (beta = 1), as the CPU does.
__global__ void k_bias_rows(float* __restrict__ out, const float* __restrict__ bias, int64_t N,
                            int OC) {
  GRID_STRIDE(i, N * OC) out[i] = bias[i % OC];
}

// The per-column sums keep the CPU's order (each column's rows in order, from the value already
// there), which leaves one thread per column to add; what makes them fast is the loading: a block
// takes kTileCols columns and reads kTileRows rows of them at a time into shared memory, every
// thread of the block loading (coalesced, all in flight), and then one warp adds the tile's rows
// in order, a column per thread.
constexpr int kTileCols = 32;  // one warp adds: a column per lane
constexpr int kTileRows = 64;  // rows a block reads at once
constexpr int kTileThreads = 256;

// dbias[o] += Σ_r dout[r,o], rows in order from the value in dbias (bias_backward's order: the
// CPU's bits).
__global__ void k_bias_backward(float* __restrict__ dbias, const float* __restrict__ dout, int N,
                                int OC) {
  __shared__ float tile[kTileRows][kTileCols + 1];
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kTileCols;
  const int lane = static_cast<int>(threadIdx.x);
  float acc = lane < kTileCols && o0 + lane < OC ? dbias[o0 + lane] : 0.0f;
  for (int64_t r0 = 0; r0 < N; r0 += kTileRows) {
    for (int e = static_cast<int>(threadIdx.x); e < kTileRows * kTileCols; e += kTileThreads) {
      const int r = e / kTileCols, c = e % kTileCols;
      tile[r][c] = r0 + r < N && o0 + c < OC ? dout[(r0 + r) * OC + o0 + c] : 0.0f;
    }
    __syncthreads();
    if (lane < kTileCols) {
      const int rows = N - r0 < kTileRows ? static_cast<int>(N - r0) : kTileRows;
      for (int r = 0; r < rows; ++r) acc = __fadd_rn(acc, tile[r][lane]);
    }
    __syncthreads();
  }
  if (lane < kTileCols && o0 + lane < OC) dbias[o0 + lane] = acc;
}

// ---- layernorm (layernorm.cpp) ------------------------------------------------------------------

// One row per 16-lane group: mean = lane_sum(x)/C, var = Σ(x−mean)² (fma lanes)/C,
// rstd = 1/√(var + eps), out = (x−mean)·rstd·w + b. row_stats' and normalise's order.
__global__ void k_layernorm_forward(float* __restrict__ out, float* __restrict__ mean,
                                    float* __restrict__ rstd, const float* __restrict__ inp,
                                    const float* __restrict__ w, const float* __restrict__ b, int N,
                                    int C) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes;
  const int lane = static_cast<int>(threadIdx.x % kLanes);
  if (row >= N) return;  // the whole 16-lane group leaves together
  const unsigned mask = lane_group_mask();
  const float* x = inp + row * C;
  float acc = 0.0f;
  for (int c = lane; c < C; c += kLanes) acc = __fadd_rn(acc, x[c]);
  const float m = __fdiv_rn(lanes_sum(acc, mask), static_cast<float>(C));
  float acc2 = 0.0f;
  for (int c = lane; c < C; c += kLanes) {
    const float d = __fsub_rn(x[c], m);
    acc2 = fmaf(d, d, acc2);
  }
  const float var = __fdiv_rn(lanes_sum(acc2, mask), static_cast<float>(C));
  const float s = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, kLnEps)));
  float* o = out + row * C;
  for (int c = lane; c < C; c += kLanes) o[c] = fmaf(__fmul_rn(__fsub_rn(x[c], m), s), w[c], b[c]);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// dinp row += (w·g − mean(w·g) − x̂·mean(w·g·x̂))·rstd, one row per 16-lane group
// (backward_row's lanes and expression).
__global__ void k_layernorm_backward_input(float* __restrict__ dinp, const float* __restrict__ dout,
                                           const float* __restrict__ inp,
                                           const float* __restrict__ w,
                                           const float* __restrict__ mean,
                                           const float* __restrict__ rstd, int N, int C) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes;
  const int lane = static_cast<int>(threadIdx.x % kLanes);
  if (row >= N) return;
  const unsigned mask = lane_group_mask();
  const float* x = inp + row * C;
  const float* g = dout + row * C;
  const float m = mean[row], s = rstd[row];
  float a1 = 0.0f, a2 = 0.0f;  // Σ w·g, Σ w·g·x̂
  for (int c = lane; c < C; c += kLanes) {
    const float dn = __fmul_rn(w[c], g[c]);
    a1 = __fadd_rn(a1, dn);
    a2 = fmaf(dn, __fmul_rn(__fsub_rn(x[c], m), s), a2);
  }
  const float mean1 = __fdiv_rn(lanes_sum(a1, mask), static_cast<float>(C));
  const float mean2 = __fdiv_rn(lanes_sum(a2, mask), static_cast<float>(C));
  float* dx = dinp + row * C;
  for (int c = lane; c < C; c += kLanes) {
    const float xhat = __fmul_rn(__fsub_rn(x[c], m), s);
    const float dn = __fmul_rn(w[c], g[c]);
    dx[c] = fmaf(__fsub_rn(__fsub_rn(dn, mean1), __fmul_rn(xhat, mean2)), s, dx[c]);
  }
}

// dbias[c] += Σ_r g, dweight[c] += Σ_r x̂·g: rows in order per channel (param_grad_row's order:
// the CPU's bits), tiled as k_bias_backward.
__global__ void k_layernorm_backward_params(float* __restrict__ dw, float* __restrict__ db,
                                            const float* __restrict__ dout,
                                            const float* __restrict__ inp,
                                            const float* __restrict__ mean,
                                            const float* __restrict__ rstd, int N, int C) {
  __shared__ float gt[kTileRows][kTileCols + 1], xt[kTileRows][kTileCols + 1];
  __shared__ float mt[kTileRows], st[kTileRows];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTileCols;
  const int lane = static_cast<int>(threadIdx.x);
  const bool mine = lane < kTileCols && c0 + lane < C;
  float w = mine ? dw[c0 + lane] : 0.0f, b = mine ? db[c0 + lane] : 0.0f;
  for (int64_t r0 = 0; r0 < N; r0 += kTileRows) {
    for (int e = static_cast<int>(threadIdx.x); e < kTileRows * kTileCols; e += kTileThreads) {
      const int r = e / kTileCols, c = e % kTileCols;
      const bool in = r0 + r < N && c0 + c < C;
      gt[r][c] = in ? dout[(r0 + r) * C + c0 + c] : 0.0f;
      xt[r][c] = in ? inp[(r0 + r) * C + c0 + c] : 0.0f;
    }
    if (threadIdx.x < kTileRows && r0 + threadIdx.x < N) {
      mt[threadIdx.x] = mean[r0 + threadIdx.x];
      st[threadIdx.x] = rstd[r0 + threadIdx.x];
    }
    __syncthreads();
    if (lane < kTileCols) {
      const int rows = N - r0 < kTileRows ? static_cast<int>(N - r0) : kTileRows;
      for (int r = 0; r < rows; ++r) {
        const float g = gt[r][lane];
        b = __fadd_rn(b, g);
        w = fmaf(__fmul_rn(__fsub_rn(xt[r][lane], mt[r]), st[r]), g, w);
      }
    }
    __syncthreads();
  }
  if (mine) {
    dw[c0 + lane] = w;
    db[c0 + lane] = b;
  }
}

// ---- attention (attention.cpp) ------------------------------------------------------------------

// In place over att rows (B,NH,T,T) of scaled scores: the softmax over the keys a query may see
// (j ≤ t when causal, key_mask[b,j] != 0); other entries and rows without any key become 0.
// softmax_row's order: max, exp lanes added in lane order, then e·(1/sum).
__global__ void k_attention_softmax(float* __restrict__ att, const uint8_t* __restrict__ key_mask,
                                    int64_t rows, int T, int NH, bool causal) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes;
  const int lane = static_cast<int>(threadIdx.x % kLanes);
  if (row >= rows) return;
  const unsigned mask = lane_group_mask();
  const int t = static_cast<int>(row % T);
  const int64_t b = row / (static_cast<int64_t>(NH) * T);
  const uint8_t* km = key_mask != nullptr ? key_mask + b * T : nullptr;
  const int nv = causal ? t + 1 : T;
  float* a = att + row * T;
  const float ninf = -INFINITY;
  float mx = ninf;
  for (int j = lane; j < nv; j += kLanes)
    if (km == nullptr || km[j] != 0) mx = a[j] > mx ? a[j] : mx;
  mx = lanes_max(mx, mask);
  if (mx == ninf) {
    for (int j = lane; j < T; j += kLanes) a[j] = 0.0f;
    return;
  }
  float acc = 0.0f;  // masked keys add exact zeros, as exp_f32(−inf) does on the CPU
  for (int j = lane; j < T; j += kLanes) {
    const bool valid = j < nv && (km == nullptr || km[j] != 0);
    const float e = valid ? exp_f32(__fsub_rn(a[j], mx)) : 0.0f;
    a[j] = e;
    acc = __fadd_rn(acc, e);
  }
  const float inv = __fdiv_rn(1.0f, lanes_sum(acc, mask));
  for (int j = lane; j < T; j += kLanes) a[j] = __fmul_rn(a[j], inv);
}

// In place over rows of d (NH·T rows of T: one batch's datt): d = att ⊙ (d − Σ att·d) · scale over
// the first n keys (causal: t+1 rounded up to 16, as the CPU; att is 0 past t), 0 after them.
// softmax_backward_row's lanes and expression.
__global__ void k_attention_softmax_backward(float* __restrict__ d, const float* __restrict__ att,
                                             int64_t rows, int T, float scale, bool causal) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes;
  const int lane = static_cast<int>(threadIdx.x % kLanes);
  if (row >= rows) return;
  const unsigned mask = lane_group_mask();
  const int t = static_cast<int>(row % T);
  const int n = causal ? min(T, (t + kLanes) / kLanes * kLanes) : T;
  float* dr = d + row * T;
  const float* a = att + row * T;
  float acc = 0.0f;
  for (int j = lane; j < n; j += kLanes) acc = fmaf(a[j], dr[j], acc);
  const float dot = lanes_sum(acc, mask);
  for (int j = lane; j < T; j += kLanes)
    dr[j] = j < n ? __fmul_rn(__fmul_rn(a[j], __fsub_rn(dr[j], dot)), scale) : 0.0f;
}

// The operands of the B·NH products of one attention step: product i = b·NH + h takes matrix
// base + b·batch + h·head of each operand (heads sit side by side in a row, batches one after
// another, so no single stride reaches them all).
// Strides in elements; `bytes` per element (4: f32, 2: bf16).
struct HeadOperand {
  const void* base;
  int64_t batch, head;
  int bytes = 4;
};
// (cuBLAS takes the operands' pointer arrays as void*; it only reads A and B)
__device__ void* head_matrix(const HeadOperand& x, int64_t bi, int64_t h) {
  return const_cast<char*>(static_cast<const char*>(x.base)) +
         (bi * x.batch + h * x.head) * x.bytes;
}
__global__ void k_head_pointers(void** __restrict__ ptrs, HeadOperand a, HeadOperand b,
                                HeadOperand c, int NH, int count) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= count) return;
  const int64_t bi = i / NH, h = i % NH;
  ptrs[i] = head_matrix(a, bi, h);
  ptrs[count + i] = head_matrix(b, bi, h);
  ptrs[2 * count + i] = head_matrix(c, bi, h);
}

// ---- bf16 operands (bf16.hpp)
// --------------------------------------------------------------------

// out = to_bf16(in): round to nearest even on the bits, a NaN kept quiet, as the CPU's to_bf16.
__global__ void k_to_bf16(uint16_t* __restrict__ out, const float* __restrict__ in, int64_t n) {
  GRID_STRIDE(i, n) {
    uint32_t u = __float_as_uint(in[i]);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      out[i] = static_cast<uint16_t>((u >> 16) | 0x40u);
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      out[i] = static_cast<uint16_t>(u >> 16);
    }
  }
}

// ---- cross-entropy (crossentropy.cpp) -----------------------------------------------------------

// Cross-entropy in four passes, with crossentropy_row's bits: the CPU's order lives only in the
// lane sums of the exponentials, which k_ce_sum keeps (16 lanes per row, each adding its elements
// in order); the max, the exponentials and the scaling are element-wise or order-free, so they
// run over every element of the (N,V) logits at once. out may alias logits: x[tgt] and the max
// are read (k_ce_max) before any pass writes out, and each later pass reads an element and
// writes it in the same thread. Ignored rows (target −1): loss 0, probs untouched, dlogits 0.

// mx[r] = max of row r, xt[r] = x[tgt]: one block per row (a max does not depend on the order).
__global__ void k_ce_max(float* __restrict__ mx, float* __restrict__ xt, const float* logits,
                         const int32_t* __restrict__ targets, int V) {
  const int64_t row = blockIdx.x;
  const int tgt = targets[row];
  if (tgt == kIgnoreIndex) return;
  const float* x = logits + row * V;
  __shared__ float part[kThreads];
  float m = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) m = x[j] > m ? x[j] : m;
  part[threadIdx.x] = m;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w)
      part[threadIdx.x] =
          part[threadIdx.x + w] > part[threadIdx.x] ? part[threadIdx.x + w] : part[threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    mx[row] = part[0];
    xt[row] = x[tgt];
  }
}

// out = exp(x − mx[row]) (dlogits of an ignored row: 0).
__global__ void k_ce_exp(float* out, const float* logits, const float* __restrict__ mx,
                         const int32_t* __restrict__ targets, bool backward, int64_t N, int V) {
  GRID_STRIDE(i, N * V) {
    const int64_t row = i / V;
    if (targets[row] == kIgnoreIndex) {
      if (backward) out[i] = 0.0f;
      continue;
    }
    out[i] = exp_f32(__fsub_rn(logits[i], mx[row]));
  }
}

// One row per 16-lane group: sum = lane sums of the exponentials in order, the lanes in order;
// losses[r] = log(sum) + (mx − x[tgt]); inv[r] = 1/sum.
__global__ void k_ce_sum(float* __restrict__ losses, float* __restrict__ inv,
                         const float* __restrict__ e, const float* __restrict__ mx,
                         const float* __restrict__ xt, const int32_t* __restrict__ targets, int N,
                         int V) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes;
  const int lane = static_cast<int>(threadIdx.x % kLanes);
  if (row >= N) return;
  const unsigned mask = lane_group_mask();
  if (targets[row] == kIgnoreIndex) {
    if (lane == 0) losses[row] = 0.0f;
    return;
  }
  const float* d = e + row * V;
  float acc = 0.0f;
  int j = lane;
  for (; j + (kUnroll - 1) * kLanes < V; j += kUnroll * kLanes) {  // loads in flight, adds in order
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = d[j + u * kLanes];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc = __fadd_rn(acc, v[u]);
  }
  for (; j < V; j += kLanes) acc = __fadd_rn(acc, d[j]);
  const float sum = lanes_sum(acc, mask);
  if (lane == 0) {
    losses[row] = __fadd_rn(logf(sum), __fsub_rn(mx[row], xt[row]));
    inv[row] = __fdiv_rn(1.0f, sum);
  }
}

// out = e·inv[row] (probs), or (e·inv[row] − onehot)·dloss (dlogits); ignored rows as they are.
__global__ void k_ce_scale(float* out, const float* __restrict__ inv,
                           const int32_t* __restrict__ targets, float dloss, bool backward,
                           int64_t N, int V) {
  GRID_STRIDE(i, N * V) {
    const int64_t row = i / V;
    const int tgt = targets[row];
    if (tgt == kIgnoreIndex) continue;
    const float p = __fmul_rn(out[i], inv[row]);
    out[i] = backward ? __fmul_rn(i - row * V == tgt ? __fsub_rn(p, 1.0f) : p, dloss) : p;
  }
}

// ---- embeddings (encoder.cpp) -------------------------------------------------------------------

// out (B·T,C) = (wte[tok] + wpe[t]) [+ wse[seg]].
__global__ void k_encoder_forward(float* __restrict__ out, const int32_t* __restrict__ tokens,
                                  const int32_t* __restrict__ segments,
                                  const float* __restrict__ wte, const float* __restrict__ wpe,
                                  const float* __restrict__ wse, int64_t BT, int T, int C) {
  GRID_STRIDE(i, BT * C) {
    const int64_t r = i / C, c = i % C;
    const float e = wte[static_cast<int64_t>(tokens[r]) * C + c];
    const float p = wpe[(r % T) * C + c];
    const float ep = __fadd_rn(e, p);
    out[i] =
        segments != nullptr ? __fadd_rn(ep, wse[static_cast<int64_t>(segments[r]) * C + c]) : ep;
  }
}

// dw[ids[k], c] += Σ dout[p, c] over the positions p of id ids[k] (positions[offsets[k] ..
// offsets[k+1]), ascending): block k, one thread per channel. Each row is summed in (b, t) order
// from its value, as the CPU's loop over r does; no two threads touch the same element.
__global__ void k_embedding_backward(float* __restrict__ dw, const float* __restrict__ dout,
                                     const int32_t* __restrict__ ids,
                                     const int32_t* __restrict__ offsets,
                                     const int32_t* __restrict__ positions, int C) {
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int k = static_cast<int>(blockIdx.x);
  float* w = dw + static_cast<int64_t>(ids[k]) * C + c;
  float acc = *w;
  for (int p = offsets[k]; p < offsets[k + 1]; ++p)
    acc = __fadd_rn(acc, dout[static_cast<int64_t>(positions[p]) * C + c]);
  *w = acc;
}

// dwpe[t, c] += Σ_b dout[b, t, c], b in order: one thread per (t, c).
__global__ void k_position_backward(float* __restrict__ dwpe, const float* __restrict__ dout, int B,
                                    int T, int C) {
  GRID_STRIDE(i, static_cast<int64_t>(T) * C) {
    float acc = dwpe[i];
    for (int64_t b = 0; b < B; ++b) acc = __fadd_rn(acc, dout[b * T * C + i]);
    dwpe[i] = acc;
  }
}

// ---- optimizer (optimizer.cpp) ------------------------------------------------------------------

// The scalars of an update, computed on the host exactly as the CPU computes them.
struct AdamCoef {
  float b1, b2, step_size, bc2_sqrt, decay, eps, grad_scale;
};
struct NesterovCoef {  // NAdam: p −= (a·m + b·g) / denom
  float a, b;
};
struct DcCoef {  // g += λ·g² / (√v·inv_sqrt_bc + eps) · Δ
  float lambda, inv_sqrt_bc, eps;
};
enum UpdateMode : int { kPlain = 0, kNesterov = 1, kDc = 2 };

// The corrections the kernels below compute: none, nesterov and dc alone. The secant
// compensation and a compensation with Nesterov's look-ahead are the CPU kernels' only
// (engine/config refuses them with pipeline.device = "cuda" before any stage is built).
void check_cuda_correction(const DelayCorrection& dc, const char* who) {
  AP_CHECK(dc.kind != DelayCorrectionKind::secant && !dc.lookahead,
           "{} on the GPU: the delay correction {}{} is computed by the CPU kernels only", who,
           dc.kind == DelayCorrectionKind::secant ? "secant" : "dc",
           dc.lookahead ? "+nesterov" : "");
}

// adamw_element: p *= decay; m = lerp(m, g, 1−β1) (fma); v = β2·v + (1−β2)·g²;
// p −= step_size·(m / (√v/√bc2 + eps)).
__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float g,
                                              const AdamCoef& c) {
  const float pi = __fmul_rn(p, c.decay);
  const float mi = fmaf(__fsub_rn(1.0f, c.b1), __fsub_rn(g, m), m);
  const float vi = __fadd_rn(__fmul_rn(c.b2, v), __fmul_rn(__fsub_rn(1.0f, c.b2), __fmul_rn(g, g)));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
  p = __fsub_rn(pi, __fmul_rn(c.step_size, __fdiv_rn(mi, denom)));
  m = mi;
  v = vi;
}

// The delay-compensated gradient g0 + λ·g0²/(√ms·inv_sqrt_bc + eps)·Δ (ms: v or SGD's mean square).
__device__ __forceinline__ float dc_gradient(float g0, float ms, float delta, const DcCoef& k) {
  const float den = __fadd_rn(__fmul_rn(__fsqrt_rn(ms), k.inv_sqrt_bc), k.eps);
  return __fadd_rn(g0, __fmul_rn(__fdiv_rn(__fmul_rn(k.lambda, __fmul_rn(g0, g0)), den), delta));
}

// One AdamW step per element: adamw_range, adamw_nesterov_range or adamw_dc_range by mode.
__global__ void k_adamw(float* __restrict__ params, const float* __restrict__ grads,
                        float* __restrict__ m, float* __restrict__ v,
                        const float* __restrict__ delta, int64_t n, AdamCoef c, int mode,
                        NesterovCoef nk, DcCoef dk) {
  GRID_STRIDE(i, n) {
    const float g0 = __fmul_rn(grads[i], c.grad_scale);
    if (mode == kNesterov) {
      const float pi = __fmul_rn(params[i], c.decay);
      const float mi = fmaf(__fsub_rn(1.0f, c.b1), __fsub_rn(g0, m[i]), m[i]);
      const float vi =
          __fadd_rn(__fmul_rn(c.b2, v[i]), __fmul_rn(__fsub_rn(1.0f, c.b2), __fmul_rn(g0, g0)));
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
      params[i] =
          __fsub_rn(pi, __fdiv_rn(__fadd_rn(__fmul_rn(nk.a, mi), __fmul_rn(nk.b, g0)), denom));
      m[i] = mi;
      v[i] = vi;
    } else {
      const float g = mode == kDc ? dc_gradient(g0, v[i], delta[i], dk) : g0;
      adamw_element(params[i], m[i], v[i], g, c);
    }
  }
}

// One SGD step per element: sgd_range, sgd_nesterov_range or sgd_dc_range by mode. With kDc,
// delta may be null (no correction); ms then still takes the uncorrected gradient.
__global__ void k_sgd(float* __restrict__ params, const float* __restrict__ grads,
                      float* __restrict__ buf, float* __restrict__ ms,
                      const float* __restrict__ delta, int64_t n, float mu, float wd, float lr,
                      float grad_scale, int mode, DcCoef dk, float ms_decay) {
  GRID_STRIDE(i, n) {
    const float g0 = __fmul_rn(grads[i], grad_scale);
    float g = g0;
    if (mode == kDc) {
      if (delta != nullptr) g = dc_gradient(g0, ms[i], delta[i], dk);
      ms[i] = __fadd_rn(__fmul_rn(ms_decay, ms[i]),
                        __fmul_rn(__fsub_rn(1.0f, ms_decay), __fmul_rn(g0, g0)));
    }
    const float p = params[i];
    const float d = __fadd_rn(g, __fmul_rn(wd, p));
    const float b = __fadd_rn(__fmul_rn(mu, buf[i]), d);
    buf[i] = b;
    const float step = mode == kNesterov ? __fadd_rn(d, __fmul_rn(mu, b)) : b;
    params[i] = __fsub_rn(p, __fmul_rn(lr, step));
  }
}

// XPipe's prediction, the CPU's expression (xpipe_predict in optimizer.cpp) without contraction
__global__ void k_xpipe_predict(float* __restrict__ out, const float* __restrict__ w,
                                const float* __restrict__ m, const float* __restrict__ v, int64_t n,
                                WeightPrediction p) {
  GRID_STRIDE(i, n) {
    if (v != nullptr) {
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v[i]), p.bc2_sqrt), p.eps);
      const float g = __fadd_rn(__fdiv_rn(__fdiv_rn(m[i], p.bc1), denom), __fmul_rn(p.wd, w[i]));
      out[i] = __fsub_rn(w[i], __fmul_rn(p.k, g));
    } else {
      out[i] = __fsub_rn(w[i], __fmul_rn(p.k, m[i]));
    }
  }
}

// partial[blk] = Σ g² over block blk of kSumBlock elements, in double: 8 consecutive threads per
// block, thread j summing elements j, j+8, ... in order, the 8 lanes then added in order
// (sumsq_block's order: the CPU's bits).
__global__ void k_sumsq_blocks(double* __restrict__ partial, const float* __restrict__ g, int64_t n,
                               int64_t nblocks) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t blk = t / kDLanes;
  const int lane = static_cast<int>(t % kDLanes);
  if (blk >= nblocks) return;  // the whole group of 8 leaves together
  const unsigned mask = 0xffu << (threadIdx.x & 24u);
  const int64_t s = blk * kSumBlock;
  const int64_t len = min(n - s, kSumBlock);
  double acc = 0.0;
  int64_t i = lane;
  for (; i + (kUnroll - 1) * kDLanes < len; i += kUnroll * kDLanes) {  // loads in flight
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = g[s + i + u * kDLanes];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const double x = static_cast<double>(v[u]);
      acc = __dadd_rn(acc, __dmul_rn(x, x));
    }
  }
  for (; i < len; i += kDLanes) {
    const double x = static_cast<double>(g[s + i]);
    acc = __dadd_rn(acc, __dmul_rn(x, x));
  }
  double sum = 0.0;
#pragma unroll
  for (int j = 0; j < kDLanes; ++j) sum = __dadd_rn(sum, __shfl_sync(mask, acc, j, kDLanes));
  if (lane == 0) partial[blk] = sum;
}

// ---- host helpers -------------------------------------------------------------------------------

// 1/√(1 − decay^k), optimizer.cpp's inv_sqrt_bias (k ≥ 1).
float inv_sqrt_bias(float decay, long k) {
  return 1.0f / std::sqrt(1.0f - static_cast<float>(std::pow(static_cast<double>(decay), k)));
}

// The positions [0, n) grouped by id: ids ascending, each id's positions ascending in
// positions[offsets[k], offsets[k+1]) (a stable sort keeps the (b, t) order).
struct IdGroups {
  std::vector<int32_t> ids, offsets, positions;
};
IdGroups group_by_id(const int32_t* id, int n) {
  IdGroups g;
  g.positions.resize(static_cast<size_t>(n));
  std::iota(g.positions.begin(), g.positions.end(), 0);
  std::stable_sort(g.positions.begin(), g.positions.end(),
                   [id](int32_t a, int32_t b) { return id[a] < id[b]; });
  for (int p = 0; p < n; ++p) {
    const int32_t v = id[g.positions[static_cast<size_t>(p)]];
    if (g.ids.empty() || g.ids.back() != v) {
      g.ids.push_back(v);
      g.offsets.push_back(p);
    }
  }
  g.offsets.push_back(n);
  return g;
}

struct HostArray {
  const void* data;
  size_t bytes;
};

// ---- a GPU's lasting memory ---------------------------------------------------------------------

// n floats of the current GPU's memory, zero-filled on `stream` (complete on return); a
// CheckFailure naming `name` and the size when out of memory
float* allocate_zeroed(const std::string& name, size_t n, cudaStream_t stream) {
  const size_t bytes = std::max<size_t>(n * sizeof(float), sizeof(float));
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) cudaGetLastError();
  AP_CHECK(e == cudaSuccess, "{}: out of memory allocating {} floats ({} bytes): {}", name, n,
           bytes, cudaGetErrorString(e));
  AP_CUDA(cudaMemsetAsync(p, 0, bytes, stream));
  AP_CUDA(cudaStreamSynchronize(stream));
  return static_cast<float*>(p);
}

// Device memory for tensors that leave a stage (BackendMemory::lasting_memory): one per GPU, for
// any thread, until the process ends, with a stream of its own for its copies (each complete on
// return). The writer of a tensor here synchronises before another stream reads it.
class CudaLastingMemory final : public BackendMemory {
 public:
  explicit CudaLastingMemory(int index) : index_(index) {
    use();
    cudaDeviceProp prop{};
    AP_CUDA(cudaGetDeviceProperties(&prop, index_));
    name_ = fmt::format("cuda:{} ({})", index_, prop.name);
    AP_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  Device device() const override { return Device::cuda; }
  std::string name() const override { return name_; }
  std::string pool() const override { return fmt::format("cuda:{}", index_); }
  BackendMemory& lasting_memory() override { return *this; }

  float* allocate(size_t n) override {
    use();
    return allocate_zeroed(name_, n, stream_);
  }
  void release(float* p) override {
    if (p == nullptr) return;
    use();
    AP_CUDA(cudaFree(p));  // every reader's copy completed before it let go
  }
  void to_backend(float* dst, const float* src, size_t n) override {
    copy_kind(dst, src, n, cudaMemcpyHostToDevice);
  }
  void to_host(float* dst, const float* src, size_t n) override {
    copy_kind(dst, src, n, cudaMemcpyDeviceToHost);
  }
  void copy(float* dst, const float* src, size_t n) override {
    copy_kind(dst, src, n, cudaMemcpyDeviceToDevice);
  }
  bool copy_from(float* dst, BackendMemory& from, const float* src, size_t n) override {
    if (from.device() != Device::cuda) return false;
    copy_kind(dst, src, n, cudaMemcpyDefault);  // unified addressing: any GPU's memory
    return true;
  }
  void fill_zero(float* dst, long N) override {
    if (N <= 0) return;
    use();
    AP_CUDA(cudaMemsetAsync(dst, 0, static_cast<size_t>(N) * sizeof(float), stream_));
    AP_CUDA(cudaStreamSynchronize(stream_));
  }
  void synchronize() override {
    use();
    AP_CUDA(cudaStreamSynchronize(stream_));
  }

 private:
  void use() const { AP_CUDA(cudaSetDevice(index_)); }
  void copy_kind(float* dst, const float* src, size_t n, cudaMemcpyKind kind) {
    if (n == 0 || dst == src) return;
    use();
    AP_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(float), kind, stream_));
    AP_CUDA(cudaStreamSynchronize(stream_));
  }
  int index_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
};

// GPU `index`'s lasting memory, made on first use and never destroyed (tensors may outlive
// statics).
BackendMemory& cuda_lasting_memory(int index) {
  static std::mutex mu;
  static std::map<int, CudaLastingMemory*> memories;
  std::lock_guard<std::mutex> lock(mu);
  CudaLastingMemory*& m = memories[index];
  if (m == nullptr) m = new CudaLastingMemory(index);
  return *m;
}

// ---- the backend --------------------------------------------------------------------------------

class CudaBackend final : public ComputeBackend {
 public:
  explicit CudaBackend(int index) : index_(index) {
    try {
      AP_CUDA(cudaSetDevice(index_));
      cudaDeviceProp prop{};
      AP_CUDA(cudaGetDeviceProperties(&prop, index_));
      name_ = fmt::format("cuda:{} ({})", index_, prop.name);
      AP_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      AP_CUBLAS(cublasCreate(&blas_));
      AP_CUBLAS(cublasSetStream(blas_, stream_));  // (resets the workspace: set it after)
      AP_CUBLAS(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));  // full fp32, no TF32
      AP_CUDA(cudaMalloc(&workspace_, kCublasWorkspace));
      AP_CUBLAS(cublasSetWorkspace(blas_, workspace_, kCublasWorkspace));
      for (Slot& s : slots_) AP_CUDA(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~CudaBackend() override { destroy(); }

  Device device() const override { return Device::cuda; }
  // the same device (its memory is every stream's), a stream, cuBLAS handle and scratch of its own
  std::unique_ptr<ComputeBackend> companion(Context&) override {
    return std::make_unique<CudaBackend>(index_);
  }
  std::string name() const override { return name_; }
  // every backend on this GPU allocates from its memory
  std::string pool() const override { return fmt::format("cuda:{}", index_); }
  BackendMemory& lasting_memory() override { return cuda_lasting_memory(index_); }
  // dst (this GPU) = src (any GPU's memory), on this backend's stream, complete on return
  bool copy_from(float* dst, BackendMemory& from, const float* src, size_t n) override {
    if (from.device() != Device::cuda) return false;
    if (n == 0 || dst == src) return true;
    use();
    AP_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDefault, stream_));
    AP_CUDA(cudaStreamSynchronize(stream_));
    return true;
  }
  std::optional<uint64_t> available_bytes() const override {
    use();
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      return std::nullopt;
    }
    return static_cast<uint64_t>(free);
  }
  Precision precision() const override { return precision_; }
  void set_precision(Precision p) override { precision_ = p; }

  // ---- memory -----------------------------------------------------------------------------------

  float* allocate(size_t n) override {
    use();
    return allocate_zeroed(name_, n, stream_);
  }

  void release(float* p) override {
    if (p == nullptr) return;
    use();
    AP_CUDA(cudaStreamSynchronize(stream_));  // no op of this backend still reads it
    AP_CUDA(cudaFree(p));
  }

  // A bump arena of device blocks (Arena's policy): a request that does not fit moves on to the
  // next block or inserts a new one (at least twice the current), never moving what was handed
  // out; reset_scratch merges several blocks into one of their total size.
  float* scratch(size_t n) override {
    use();
    const size_t bytes = round_up(std::max<size_t>(n * sizeof(float), 1), kAlign);
    while (true) {
      if (!blocks_.empty()) {
        Block& b = blocks_[cur_];
        if (b.size - b.used >= bytes) {
          char* p = b.data + b.used;
          b.used += bytes;
          return reinterpret_cast<float*>(p);
        }
        if (cur_ + 1 < blocks_.size() && blocks_[cur_ + 1].size >= bytes) {
          ++cur_;
          blocks_[cur_].used = 0;
          continue;
        }
      }
      const size_t last = blocks_.empty() ? 0 : blocks_[cur_].size;
      const size_t at = blocks_.empty() ? 0 : cur_ + 1;
      blocks_.insert(blocks_.begin() + static_cast<std::ptrdiff_t>(at),
                     make_block(std::max({bytes, kMinScratchBlock, 2 * last})));
      cur_ = at;
    }
  }

  void reset_scratch() override {
    use();
    if (blocks_.size() > 1) {
      size_t total = 0;
      for (const Block& b : blocks_) total += b.size;
      AP_CUDA(cudaStreamSynchronize(stream_));  // kernels issued before may still use them
      for (Block& b : blocks_) AP_CUDA(cudaFree(b.data));
      blocks_.clear();
      blocks_.push_back(make_block(total));
    }
    if (!blocks_.empty()) blocks_[0].used = 0;
    cur_ = 0;
  }

  void to_backend(float* dst, const float* src, size_t n) override {
    if (n == 0) return;
    use();
    AP_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    // the caller may reuse src on return even when it is pinned (then the copy is truly async)
    AP_CUDA(cudaStreamSynchronize(stream_));
  }

  void to_host(float* dst, const float* src, size_t n) override {
    if (n == 0) return;
    use();
    AP_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    AP_CUDA(cudaStreamSynchronize(stream_));
  }

  // dst = src on the device; overlapping ranges (memmove) go through a bounce buffer.
  void copy(float* dst, const float* src, size_t n) override {
    if (n == 0 || dst == src) return;
    use();
    const size_t bytes = n * sizeof(float);
    const bool overlap = dst < src + n && src < dst + n;
    if (!overlap) {
      AP_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
      return;
    }
    void* tmp = ensure(bounce_, bytes);
    AP_CUDA(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, stream_));
    AP_CUDA(cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, stream_));
  }

  void synchronize() override {
    use();
    AP_CUDA(cudaStreamSynchronize(stream_));
  }

  // ---- linear layer -----------------------------------------------------------------------------

  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int C, int OC) override {
    use();
    if (N == 0 || OC == 0) return;
    if (bias != nullptr) {
      k_bias_rows<<<grid_stride_blocks(int64_t{N} * OC), kThreads, 0, stream_>>>(out, bias, N, OC);
      AP_LAUNCHED(k_bias_rows);
    }
    // out (N,OC) = inp (N,C) · weight (OC,C)ᵀ (+ the bias already in out)
    product(false, true, N, OC, C, operand(inp, int64_t{N} * C, 0), C,
            operand(weight, int64_t{OC} * C, 1), C, bias != nullptr ? 1.0f : 0.0f, out, OC);
  }

  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int C, int OC) override {
    if (dinp != nullptr) matmul_backward_input(dinp, dout, weight, N, C, OC);
    matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC);
  }

  void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C,
                             int OC) override {
    use();
    // dinp (N,C) += dout (N,OC) · weight (OC,C)
    product(false, false, N, C, OC, operand(dout, int64_t{N} * OC, 0), OC,
            operand(weight, int64_t{OC} * C, 1), C, 1.0f, dinp, C);
  }

  void matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                              int N, int C, int OC) override {
    use();
    // dweight (OC,C) += doutᵀ (OC,N) · inp (N,C)
    product(true, false, OC, C, N, operand(dout, int64_t{N} * OC, 0), OC,
            operand(inp, int64_t{N} * C, 1), C, 1.0f, dweight, C);
    if (dbias != nullptr && OC > 0) {
      k_bias_backward<<<static_cast<unsigned>(cdiv(OC, kTileCols)), kTileThreads, 0, stream_>>>(
          dbias, dout, N, OC);
      AP_LAUNCHED(k_bias_backward);
    }
  }

  // ---- normalisation, activation, attention -----------------------------------------------------

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C) override {
    use();
    if (N == 0) return;
    k_layernorm_forward<<<row_blocks(N), kRowThreads, 0, stream_>>>(out, mean, rstd, inp, weight,
                                                                    bias, N, C);
    AP_LAUNCHED(k_layernorm_forward);
  }

  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    use();
    if (N == 0 || C == 0) return;
    k_layernorm_backward_input<<<row_blocks(N), kRowThreads, 0, stream_>>>(dinp, dout, inp, weight,
                                                                           mean, rstd, N, C);
    AP_LAUNCHED(k_layernorm_backward_input);
    k_layernorm_backward_params<<<static_cast<unsigned>(cdiv(C, kTileCols)), kTileThreads, 0,
                                  stream_>>>(dweight, dbias, dout, inp, mean, rstd, N, C);
    AP_LAUNCHED(k_layernorm_backward_params);
  }

  void gelu_forward(float* out, const float* inp, long N) override {
    use();
    if (N <= 0) return;
    k_gelu_forward<<<grid_stride_blocks(N), kThreads, 0, stream_>>>(out, inp, N);
    AP_LAUNCHED(k_gelu_forward);
  }

  void gelu_backward(float* dinp, const float* inp, const float* dout, long N) override {
    use();
    if (N <= 0) return;
    k_gelu_backward<<<grid_stride_blocks(N), kThreads, 0, stream_>>>(dinp, inp, dout, N);
    AP_LAUNCHED(k_gelu_backward);
  }

  // Per batch b, over the NH heads at once (strided-batched GEMMs; head h of q, k, v at columns
  // h·hs, C + h·hs, 2C + h·hs of the rows of 3C): att_h = scale·Q_h·K_hᵀ, the masked softmax of
  // every row, out_h = att_h·V_h. The causal upper triangle is computed and then zeroed.
  void attention_forward(float* out, float* att, const float* qkv, const uint8_t* key_mask,
                         bool causal, int B, int T, int C, int NH) override {
    AP_CHECK(NH > 0 && C % NH == 0, "attention: C={} not divisible by NH={}", C, NH);
    use();
    if (B == 0 || T == 0) return;
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int64_t TT = int64_t{T} * T;
    const uint8_t* mask = nullptr;
    if (key_mask != nullptr)
      mask = static_cast<const uint8_t*>(stage({{key_mask, size_t(B) * size_t(T)}})[0]);
    const int64_t bq = int64_t{T} * C3, ba = int64_t{NH} * TT;
    // the products' operands: qkv (and below the probabilities) as they are, or rounded to bf16
    const int w = precision_ == Precision::bf16 ? 2 : 4;
    const void* x = operand(qkv, int64_t{B} * bq, 0);
    const auto at = [&](int64_t offset) { return static_cast<const char*>(x) + offset * w; };
    // att(b,h) = scale·Q·Kᵀ, every (b, h) in one batched product
    gemm_heads(false, true, T, T, hs, scale, {at(0), bq, hs, w}, C3, {at(C), bq, hs, w}, C3, 0.0f,
               {att, ba, TT}, T, B, NH);
    const int64_t rows = int64_t{B} * NH * T;
    k_attention_softmax<<<row_blocks(rows), kRowThreads, 0, stream_>>>(att, mask, rows, T, NH,
                                                                       causal);
    AP_LAUNCHED(k_attention_softmax);
    // out(b,h) = att·V
    gemm_heads(false, false, T, hs, T, 1.0f, {operand(att, B * ba, 1), ba, TT, w}, T,
               {at(2 * C), bq, hs, w}, C3, 0.0f, {out, int64_t{T} * C, hs}, C, B, NH);
  }

  // Every (b, h) at once, with D = scratch (B·NH·T·T): D = dout·Vᵀ; dV += attᵀ·dout;
  // D = att ⊙ (D − Σ_row att·D)·scale; dQ += D·K; dK += Dᵀ·Q.
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                          const float* att, int B, int T, int C, int NH, bool causal) override {
    AP_CHECK(NH > 0 && C % NH == 0, "attention: C={} not divisible by NH={}", C, NH);
    use();
    if (B == 0 || T == 0) return;
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int64_t TT = int64_t{T} * T;
    const int64_t bq = int64_t{T} * C3, ba = int64_t{NH} * TT, bo = int64_t{T} * C;
    // the products' operands as they are, or rounded to bf16 (D after the softmax's backward)
    const int w = precision_ == Precision::bf16 ? 2 : 4;
    const void* x = operand(qkv, int64_t{B} * bq, 0);
    const auto at = [&](int64_t offset) { return static_cast<const char*>(x) + offset * w; };
    const HeadOperand A{operand(att, B * ba, 1), ba, TT, w},
        go{operand(dout, B * bo, 2), bo, hs, w};
    const HeadOperand q{at(0), bq, hs, w}, k{at(C), bq, hs, w}, v{at(2 * C), bq, hs, w};
    const HeadOperand D{scratch, ba, TT}, dq{dqkv, bq, hs}, dk{dqkv + C, bq, hs},
        dv{dqkv + 2 * C, bq, hs};
    gemm_heads(false, true, T, T, hs, 1.0f, go, C, v, C3, 0.0f, D, T, B, NH);
    gemm_heads(true, false, T, hs, T, 1.0f, A, T, go, C, 1.0f, dv, C3, B, NH);
    const int64_t rows = int64_t{B} * NH * T;
    k_attention_softmax_backward<<<row_blocks(rows), kRowThreads, 0, stream_>>>(scratch, att, rows,
                                                                                T, scale, causal);
    AP_LAUNCHED(k_attention_softmax_backward);
    const HeadOperand D16{operand(scratch, B * ba, 3), ba, TT, w};
    gemm_heads(false, false, T, hs, T, 1.0f, D16, T, k, C3, 1.0f, dq, C3, B, NH);
    gemm_heads(true, false, T, hs, T, 1.0f, D16, T, q, C3, 1.0f, dk, C3, B, NH);
  }

  // ---- loss -------------------------------------------------------------------------------------

  int crossentropy_forward(float* losses, float* probs, const float* logits, const int32_t* targets,
                           int N, int V) override {
    return crossentropy(losses, probs, logits, targets, 1.0f, false, N, V);
  }

  int crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                    const int32_t* targets, float dloss, int N, int V) override {
    return crossentropy(losses, dlogits, logits, targets, dloss, true, N, V);
  }

  double sum_losses(const float* losses, int N) override {
    if (N <= 0) return 0.0;
    std::vector<float> h(static_cast<size_t>(N));
    to_host(h.data(), losses, h.size());
    double s = 0.0;
    for (float x : h) s += static_cast<double>(x);
    return s;
  }

  // ---- embeddings -------------------------------------------------------------------------------

  void encoder_forward(float* out, const int32_t* tokens, const int32_t* segments, const float* wte,
                       const float* wpe, const float* wse, int B, int T, int C) override {
    use();
    const int64_t BT = int64_t{B} * T;
    if (BT == 0 || C == 0) return;
    const bool seg = segments != nullptr && wse != nullptr;
    const size_t bytes = static_cast<size_t>(BT) * sizeof(int32_t);
    const auto d = stage({{tokens, bytes}, {seg ? segments : nullptr, seg ? bytes : 0}});
    const auto* tok = static_cast<const int32_t*>(d[0]);
    const auto* sg = static_cast<const int32_t*>(d[1]);  // null without segments
    const float* se = seg ? wse : nullptr;
    k_encoder_forward<<<grid_stride_blocks(BT * C), kThreads, 0, stream_>>>(out, tok, sg, wte, wpe,
                                                                            se, BT, T, C);
    AP_LAUNCHED(k_encoder_forward);
  }

  void encoder_backward(float* dwte, float* dwpe, float* dwse, const float* dout,
                        const int32_t* tokens, const int32_t* segments, int B, int T,
                        int C) override {
    use();
    const int BT = B * T;
    if (BT == 0 || C == 0) return;
    const bool seg = segments != nullptr && dwse != nullptr;
    const IdGroups tok = group_by_id(tokens, BT);
    const IdGroups sg = seg ? group_by_id(segments, BT) : IdGroups{};
    auto arr = [](const std::vector<int32_t>& v) {
      return HostArray{v.data(), v.size() * sizeof(int32_t)};
    };
    const auto d = stage({arr(tok.ids), arr(tok.offsets), arr(tok.positions), arr(sg.ids),
                          arr(sg.offsets), arr(sg.positions)});
    auto ints = [&](int i) { return static_cast<const int32_t*>(d[static_cast<size_t>(i)]); };
    embedding_backward(dwte, dout, tok, ints(0), ints(1), ints(2), C);
    k_position_backward<<<grid_stride_blocks(int64_t{T} * C), kThreads, 0, stream_>>>(dwpe, dout, B,
                                                                                      T, C);
    AP_LAUNCHED(k_position_backward);
    if (seg) embedding_backward(dwse, dout, sg, ints(3), ints(4), ints(5), C);
  }

  // ---- element-wise -----------------------------------------------------------------------------

  void residual_forward(float* out, const float* a, const float* b, long N) override {
    use();
    if (N <= 0) return;
    k_residual_forward<<<grid_stride_blocks(N), kThreads, 0, stream_>>>(out, a, b, N);
    AP_LAUNCHED(k_residual_forward);
  }

  void residual_backward(float* da, float* db, const float* dout, long N) override {
    use();
    if (N <= 0) return;
    k_residual_backward<<<grid_stride_blocks(N), kThreads, 0, stream_>>>(da, db, dout, N);
    AP_LAUNCHED(k_residual_backward);
  }

  void accumulate(float* dst, const float* src, long N) override {
    use();
    if (N <= 0) return;
    k_accumulate<<<grid_stride_blocks(N), kThreads, 0, stream_>>>(dst, src, N);
    AP_LAUNCHED(k_accumulate);
  }

  void fill_zero(float* dst, long N) override {
    use();
    if (N <= 0) return;
    AP_CUDA(cudaMemsetAsync(dst, 0, static_cast<size_t>(N) * sizeof(float), stream_));
  }

  void scale_inplace(float* dst, float s, long N) override {
    use();
    if (N <= 0) return;
    k_scale<<<grid_stride_blocks(N), kThreads, 0, stream_>>>(dst, s, N);
    AP_LAUNCHED(k_scale);
  }

  void gather_rows(float* out, const float* x, const int32_t* rows, int n, int C) override {
    use();
    if (n <= 0 || C <= 0) return;
    const auto* r = static_cast<const int32_t*>(stage({{rows, size_t(n) * sizeof(int32_t)}})[0]);
    k_gather_rows<<<grid_stride_blocks(int64_t{n} * C), kThreads, 0, stream_>>>(out, x, r, n, C);
    AP_LAUNCHED(k_gather_rows);
  }

  void scatter_rows(float* out, const float* x, const int32_t* rows, int n, int C) override {
    use();
    if (n <= 0 || C <= 0) return;
    const auto* r = static_cast<const int32_t*>(stage({{rows, size_t(n) * sizeof(int32_t)}})[0]);
    k_scatter_rows<<<grid_stride_blocks(int64_t{n} * C), kThreads, 0, stream_>>>(out, x, r, n, C);
    AP_LAUNCHED(k_scatter_rows);
  }

  // ---- optimizer --------------------------------------------------------------------------------

  void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                    const AdamWParams& p, long t, float grad_scale,
                    const DelayCorrection& dc) override {
    AP_CHECK(t >= 1, "adamw_update: step t = {}, must be >= 1", t);
    check_cuda_correction(dc, "adamw_update");
    use();
    // the CPU's scalars, computed the same way (adamw_update in optimizer.cpp)
    const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(p.beta1), t));
    const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(p.beta2), t));
    const AdamCoef c{p.beta1, p.beta2,   p.lr / bc1, std::sqrt(bc2), 1.0f - p.lr * p.weight_decay,
                     p.eps,   grad_scale};
    int mode = kPlain;
    NesterovCoef nk{0.0f, 0.0f};
    DcCoef dk{0.0f, 1.0f, p.eps};
    if (dc.kind == DelayCorrectionKind::nesterov) {
      const NadamSteps s = nadam_steps(p.lr, p.beta1, t, dc.momentum_decay);
      nk = {s.on_m, s.on_g};
      mode = kNesterov;
    } else if (dc.kind == DelayCorrectionKind::dc && dc.delta != nullptr && t > 1) {
      dk = {dc.lambda, inv_sqrt_bias(p.beta2, t - 1), p.eps};
      mode = kDc;
    }
    if (n == 0) return;
    const int64_t len = static_cast<int64_t>(n);
    k_adamw<<<grid_stride_blocks(len), kThreads, 0, stream_>>>(
        params, grads, m, v, mode == kDc ? dc.delta : nullptr, len, c, mode, nk, dk);
    AP_LAUNCHED(k_adamw);
  }

  void sgd_update(float* params, const float* grads, float* momentum_buf, size_t n,
                  const SGDParams& p, float grad_scale, const DelayCorrection& dc) override {
    check_cuda_correction(dc, "sgd_update");
    use();
    int mode = kPlain;
    DcCoef dk{0.0f, 1.0f, kDcEps};
    bool on = false;
    if (dc.kind == DelayCorrectionKind::nesterov) {
      mode = kNesterov;
    } else if (dc.kind == DelayCorrectionKind::dc) {
      AP_CHECK(dc.mean_square != nullptr && dc.step >= 1,
               "sgd_update with dc: needs its mean square and the step (got step {})", dc.step);
      // without a delta (nothing stale) or at step 1 the correction is 0; the mean square still
      // takes the gradient
      on = dc.delta != nullptr && dc.step > 1;
      dk = {dc.lambda, on ? inv_sqrt_bias(dc.ms_decay, dc.step - 1) : 1.0f, kDcEps};
      mode = kDc;
    }
    if (n == 0) return;
    const int64_t len = static_cast<int64_t>(n);
    k_sgd<<<grid_stride_blocks(len), kThreads, 0, stream_>>>(
        params, grads, momentum_buf, mode == kDc ? dc.mean_square : nullptr,
        on ? dc.delta : nullptr, len, p.momentum, p.weight_decay, p.lr, grad_scale, mode, dk,
        dc.ms_decay);
    AP_LAUNCHED(k_sgd);
  }

  void xpipe_predict(float* out, const float* w, const float* m, const float* v, size_t n,
                     const WeightPrediction& p) override {
    use();
    if (n == 0) return;
    const int64_t len = static_cast<int64_t>(n);
    k_xpipe_predict<<<grid_stride_blocks(len), kThreads, 0, stream_>>>(out, w, m, v, len, p);
    AP_LAUNCHED(k_xpipe_predict);
  }

  double grad_sumsq(const float* grads, size_t n) override {
    if (n == 0) return 0.0;
    use();
    const int64_t len = static_cast<int64_t>(n);
    const int64_t nb = cdiv(len, kSumBlock);
    // (the previous call waited for its partials: growing the buffer cannot free one in use)
    auto* partial =
        static_cast<double*>(ensure(partials_, static_cast<size_t>(nb) * sizeof(double)));
    k_sumsq_blocks<<<blocks_for(nb * kDLanes), kThreads, 0, stream_>>>(partial, grads, len, nb);
    AP_LAUNCHED(k_sumsq_blocks);
    std::vector<double> h(static_cast<size_t>(nb));
    AP_CUDA(cudaMemcpyAsync(h.data(), partial, h.size() * sizeof(double), cudaMemcpyDeviceToHost,
                            stream_));
    AP_CUDA(cudaStreamSynchronize(stream_));
    double total = 0.0;  // blocks in order, as the CPU
    for (double x : h) total += x;
    return total;
  }

 private:
  struct Block {  // one scratch block
    char* data = nullptr;
    size_t size = 0;
    size_t used = 0;
  };
  struct DeviceBuffer {  // grow-only
    void* data = nullptr;
    size_t bytes = 0;
  };
  struct Slot {  // one pinned staging buffer and the event of the copy that last read it
    char* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
  };
  static constexpr size_t kSlots = 4;

  // Every public entry point that touches the device: this backend's GPU for this thread.
  void use() const { AP_CUDA(cudaSetDevice(index_)); }

  Block make_block(size_t bytes) {
    Block b;
    b.size = round_up(bytes, kAlign);
    const cudaError_t e = cudaMalloc(&b.data, b.size);
    if (e != cudaSuccess) cudaGetLastError();
    AP_CHECK(e == cudaSuccess, "{}: out of memory allocating {} bytes of scratch: {}", name_,
             b.size, cudaGetErrorString(e));
    return b;
  }

  // At least `bytes` of b; a smaller buffer is freed once the stream no longer uses it.
  void* ensure(DeviceBuffer& b, size_t bytes) {
    if (b.bytes >= bytes) return b.data;
    const size_t size = std::max(round_up(bytes, kAlign), 2 * b.bytes);
    if (b.data != nullptr) {
      AP_CUDA(cudaStreamSynchronize(stream_));
      AP_CUDA(cudaFree(b.data));
      b.data = nullptr;
      b.bytes = 0;
    }
    AP_CUDA(cudaMalloc(&b.data, size));
    b.bytes = size;
    return b.data;
  }

  // Host index arrays to the device, each at a kAlign-aligned offset of the staging buffer:
  // returns their device addresses (null for an empty one). They are packed into the next
  // pinned slot of a ring (waiting for the copy that last read that slot, kSlots ops ago), then
  // copied on the stream into the device staging buffer; the copy runs after every kernel issued
  // before, so the kernels of earlier ops have read the buffer's previous contents by then.
  std::array<const void*, 6> stage(std::initializer_list<HostArray> arrays) {
    std::array<const void*, 6> out{};
    AP_CHECK(arrays.size() <= out.size(), "stage: {} arrays", arrays.size());
    size_t total = 0;
    for (const HostArray& a : arrays) total += round_up(a.bytes, kAlign);
    if (total == 0) return out;
    Slot& s = slots_[next_slot_];
    next_slot_ = (next_slot_ + 1) % kSlots;
    AP_CUDA(cudaEventSynchronize(s.done));
    if (s.bytes < total) {
      const size_t size = std::max(round_up(total, size_t{1} << 16), 2 * s.bytes);
      if (s.host != nullptr) AP_CUDA(cudaFreeHost(s.host));
      s.host = nullptr;
      s.bytes = 0;
      AP_CUDA(cudaMallocHost(&s.host, size));
      s.bytes = size;
    }
    char* dev = static_cast<char*>(ensure(staging_, total));
    size_t off = 0;
    size_t i = 0;
    for (const HostArray& a : arrays) {
      if (a.bytes > 0) {
        std::memcpy(s.host + off, a.data, a.bytes);
        out[i] = dev + off;
      }
      off += round_up(a.bytes, kAlign);
      ++i;
    }
    AP_CUDA(cudaMemcpyAsync(dev, s.host, total, cudaMemcpyHostToDevice, stream_));
    AP_CUDA(cudaEventRecord(s.done, stream_));
    return out;
  }

  // C (M×N, row-major) = alpha·op(A)·op(B) + beta·C. cuBLAS is column-major, where this C is Cᵀ
  // = op(B)ᵀ·op(A)ᵀ: the operands swap, each keeping its row-major leading dimension.
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) {
    if (M == 0 || N == 0) return;
    AP_CUBLAS(cublasSgemm(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N,
                          M, K, &alpha, B, ldb, A, lda, &beta, C, ldc));
  }

  // The B·NH products of one attention step as one batched product (k_head_pointers): product
  // (b, h) is C(b,h) = alpha·op(A(b,h))·op(B(b,h)) + beta·C(b,h), row-major, as gemm().
  // A and B are both f32 (bytes 4) or both bf16 (bytes 2: bf16 inputs, f32 accumulation); C f32.
  void gemm_heads(bool ta, bool tb, int M, int N, int K, float alpha, HeadOperand A, int lda,
                  HeadOperand B, int ldb, float beta, HeadOperand C, int ldc, int batches, int NH) {
    const int count = batches * NH;
    if (M == 0 || N == 0 || count == 0) return;
    // in stream order: the pointers of one product are written after the product before ran
    auto* ptrs =
        static_cast<void**>(ensure(head_ptrs_, 3 * static_cast<size_t>(count) * sizeof(void*)));
    k_head_pointers<<<blocks_for(count), kThreads, 0, stream_>>>(ptrs, A, B, C, NH, count);
    AP_LAUNCHED(k_head_pointers);
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                            opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (A.bytes == 4) {
      AP_CUBLAS(cublasSgemmBatched(blas_, opb, opa, N, M, K, &alpha,
                                   reinterpret_cast<const float* const*>(ptrs + count), ldb,
                                   reinterpret_cast<const float* const*>(ptrs), lda, &beta,
                                   reinterpret_cast<float* const*>(ptrs + 2 * count), ldc, count));
    } else {
      AP_CUBLAS(cublasGemmBatchedEx(blas_, opb, opa, N, M, K, &alpha, ptrs + count, CUDA_R_16BF,
                                    ldb, ptrs, CUDA_R_16BF, lda, &beta, ptrs + 2 * count,
                                    CUDA_R_32F, ldc, count, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
    }
  }

  // A product's operand: x itself in fp32; in bf16 its n values rounded into bf16 buffer `slot`
  // (reused by the next op in stream order).
  const void* operand(const float* x, int64_t n, int slot) {
    if (precision_ == Precision::fp32) return x;
    auto* out = static_cast<uint16_t*>(
        ensure(bf16_[static_cast<size_t>(slot)], static_cast<size_t>(n) * sizeof(uint16_t)));
    k_to_bf16<<<grid_stride_blocks(n), kThreads, 0, stream_>>>(out, x, n);
    AP_LAUNCHED(k_to_bf16);
    return out;
  }

  // gemm() on operand()s: sgemm in fp32, bf16 inputs with f32 accumulation in bf16.
  void product(bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B,
               int ldb, float beta, float* C, int ldc) {
    if (M == 0 || N == 0) return;
    if (precision_ == Precision::fp32) {
      gemm(ta, tb, M, N, K, 1.0f, static_cast<const float*>(A), lda, static_cast<const float*>(B),
           ldb, beta, C, ldc);
      return;
    }
    const float one = 1.0f;
    AP_CUBLAS(cublasGemmEx(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N,
                           M, K, &one, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta, C,
                           CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  int crossentropy(float* losses, float* out, const float* logits, const int32_t* targets,
                   float dloss, bool backward, int N, int V) {
    int count = 0;
    for (int r = 0; r < N; ++r) {
      const int32_t tgt = targets[r];
      if (tgt == kIgnoreIndex) continue;
      AP_CHECK(tgt >= 0 && tgt < V, "crossentropy: target {} at row {} outside [0, {}) and not {}",
               tgt, r, V, kIgnoreIndex);
      ++count;
    }
    use();
    if (N <= 0) return count;
    const auto* tg =
        static_cast<const int32_t*>(stage({{targets, size_t(N) * sizeof(int32_t)}})[0]);
    auto* rows = static_cast<float*>(ensure(ce_rows_, 3 * size_t(N) * sizeof(float)));
    float *mx = rows, *xt = rows + N, *inv = rows + 2 * int64_t{N};
    k_ce_max<<<static_cast<unsigned>(N), kThreads, 0, stream_>>>(mx, xt, logits, tg, V);
    AP_LAUNCHED(k_ce_max);
    k_ce_exp<<<grid_stride_blocks(int64_t{N} * V), kThreads, 0, stream_>>>(out, logits, mx, tg,
                                                                           backward, N, V);
    AP_LAUNCHED(k_ce_exp);
    k_ce_sum<<<row_blocks(N), kRowThreads, 0, stream_>>>(losses, inv, out, mx, xt, tg, N, V);
    AP_LAUNCHED(k_ce_sum);
    k_ce_scale<<<grid_stride_blocks(int64_t{N} * V), kThreads, 0, stream_>>>(out, inv, tg, dloss,
                                                                             backward, N, V);
    AP_LAUNCHED(k_ce_scale);
    return count;
  }

  void embedding_backward(float* dw, const float* dout, const IdGroups& g, const int32_t* ids,
                          const int32_t* offsets, const int32_t* positions, int C) {
    if (g.ids.empty()) return;
    const dim3 grid(static_cast<unsigned>(g.ids.size()), blocks_for(C));
    k_embedding_backward<<<grid, kThreads, 0, stream_>>>(dw, dout, ids, offsets, positions, C);
    AP_LAUNCHED(k_embedding_backward);
  }

  // Frees everything (the constructor's cleanup too); never throws.
  void destroy() noexcept {
    if (cudaSetDevice(index_) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (Block& b : blocks_) cudaFree(b.data);
    blocks_.clear();
    for (DeviceBuffer* b : {&staging_, &bounce_, &partials_, &ce_rows_, &head_ptrs_})
      if (b->data != nullptr) cudaFree(b->data);
    for (DeviceBuffer& b : bf16_)
      if (b.data != nullptr) cudaFree(b.data);
    for (Slot& s : slots_) {
      if (s.host != nullptr) cudaFreeHost(s.host);
      if (s.done != nullptr) cudaEventDestroy(s.done);
      s = Slot{};
    }
    if (blas_ != nullptr) cublasDestroy(blas_);
    if (workspace_ != nullptr) cudaFree(workspace_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    blas_ = nullptr;
    workspace_ = nullptr;
    stream_ = nullptr;
    cudaGetLastError();
  }

  int index_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;  // cuBLAS's, owned: no sharing with other handles' streams
  std::vector<Block> blocks_;  // scratch
  size_t cur_ = 0;
  std::array<Slot, kSlots> slots_{};
  size_t next_slot_ = 0;
  DeviceBuffer staging_;              // staged index arrays
  DeviceBuffer bounce_;               // overlapping copies
  DeviceBuffer partials_;             // grad_sumsq's per-block sums
  DeviceBuffer ce_rows_;              // cross-entropy's per-row max, x[target] and 1/sum
  DeviceBuffer head_ptrs_;            // attention's batched products: the operands' pointers
  std::array<DeviceBuffer, 4> bf16_;  // bf16 roundings of products' operands (operand())
  Precision precision_ = Precision::fp32;
};

// The reason no GPU is usable, or "" with the device count in *count.
std::string device_count(int* count) {
  *count = 0;
  const cudaError_t e = cudaGetDeviceCount(count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    *count = 0;
    return fmt::format("no usable GPU: {} ({})", cudaGetErrorString(e), cudaGetErrorName(e));
  }
  if (*count == 0) return "no usable GPU: no CUDA device present";
  return {};
}

}  // namespace

std::unique_ptr<ComputeBackend> make_cuda_backend(int device_index) {
  int n = 0;
  const std::string why = device_count(&n);
  AP_CHECK(why.empty(), "{}", why);
  AP_CHECK(device_index >= 0 && device_index < n, "cuda device index {}, but {} GPU(s)",
           device_index, n);
  return std::make_unique<CudaBackend>(device_index);
}

std::string cuda_unavailable_reason() {
  int n = 0;
  return device_count(&n);
}

}  // namespace actorpipe
