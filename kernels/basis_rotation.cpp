// AdamW in the eigenbasis of the gradients' covariances: GEMMs through gemm (bitwise the same
// for any thread count), the eigenvectors through LAPACK's dsyevd (OpenBLAS's, on one thread),
// the element-wise steps in float as adamw_update's.
#include "kernels/basis_rotation.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "kernels/check.hpp"
#include "kernels/gemm.hpp"

extern "C" {
// LAPACK (OpenBLAS ships it): eigenvalues and eigenvectors of a symmetric matrix, column-major.
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
             double* work, const int* lwork, int* iwork, const int* liwork, int* info);
}

namespace actorpipe {

namespace {

// Calls f(first, size, offset) for each diagonal block of a side of n in blocks of b: its first
// row (or column), its size, and where its matrix starts in the side's array (i·b²).
template <class F>
void for_blocks(int n, int b, F&& f) {
  if (b <= 0) b = n;  // a shape made by hand, without its blocks: the whole side
  for (int first = 0, i = 0; first < n; first += b, ++i)
    f(first, std::min(b, n - first), static_cast<size_t>(i) * static_cast<size_t>(b) * b);
}

// for_blocks over the blocks of a side of n in blocks of b that start in [from, to) (block
// bounds), spread over ctx's threads when there are two blocks or more: each block's products
// then run whole on one thread (gemm called inside a chunk computes on that thread, and gemm's
// bits are the unsplit product's either way), so the bits do not depend on the thread count. A
// single block (a whole side) runs on the caller, where gemm splits its products itself.
template <class F>
void for_blocks_on(Context& ctx, int n, int b, int from, int to, F&& f) {
  if (b <= 0) b = n;
  const int i0 = from / b, count = (std::min(to, n) - from + b - 1) / b;
  auto block = [&](int64_t i) {
    const int first = static_cast<int>(i) * b;
    f(first, std::min(b, n - first), static_cast<size_t>(i) * static_cast<size_t>(b) * b);
  };
  if (count < 2 || ctx.threads() < 2) {
    for (int i = i0; i < i0 + count; ++i) block(i);
    return;
  }
  ctx.parallel_for(count, [&](int, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) block(i0 + i);
  });
}

// Calls f(r0, r1) for each panel of a matrix's rows: `panel` rows each, the last taking a rest
// shorter than a panel (so no panel is shorter than `panel`).
template <class F>
void for_panels(int rows, int panel, F&& f) {
  for (int r0 = 0, r1 = 0; r0 < rows; r0 = r1) {
    r1 = rows - r0 < 2L * panel ? rows : r0 + panel;
    f(r0, r1);
  }
}

// Floats of a panel as large as for_panels' largest (the last, up to 2·panel − 1 rows).
size_t largest_panel_floats(const RotationShape& s, int panel) {
  return static_cast<size_t>(std::min<long>(s.rows, 2L * panel - 1)) * static_cast<size_t>(s.cols);
}

size_t side_floats(int n, int b) {
  size_t floats = 0;
  for_blocks(n, b, [&](int, int k, size_t) { floats += static_cast<size_t>(k) * k; });
  return floats;
}

}  // namespace

size_t RotationShape::left_floats() const {
  return left ? side_floats(rows, left_block) : 0;
}

size_t RotationShape::right_floats() const {
  return right ? side_floats(cols, right_block) : 0;
}

size_t RotationShape::state_floats() const {
  return 2 * (left_floats() + right_floats());
}

RotationShape rotation_shape(long rows, long cols, long max_dim, long block) {
  AP_CHECK(rows > 0 && cols > 0, "rotation_shape: a {} x {} matrix", rows, cols);
  AP_CHECK(block >= 0, "rotation_shape: block {}, must be >= 0", block);
  RotationShape s;
  s.rows = static_cast<int>(rows);
  s.cols = static_cast<int>(cols);
  s.left = rows <= max_dim;
  s.right = cols <= max_dim;
  s.left_block = static_cast<int>(block > 0 && block < rows ? block : rows);
  s.right_block = static_cast<int>(block > 0 && block < cols ? block : cols);
  return s;
}

RotationState rotation_state(const RotationShape& shape, float* state) {
  const size_t lf = shape.left_floats(), rf = shape.right_floats();
  RotationState s;
  if (shape.left) {
    s.left_cov = state;
    s.left_basis = state + lf + rf;
  }
  if (shape.right) {
    s.right_cov = state + lf;
    s.right_basis = state + 2 * lf + rf;
  }
  return s;
}

void symmetric_eigenvectors(const float* a, int n, float* q) {
  AP_CHECK(n > 0, "symmetric_eigenvectors: n = {}", n);
  const size_t nn = static_cast<size_t>(n) * static_cast<size_t>(n);
  std::vector<double> z(a, a + nn), w(static_cast<size_t>(n));
  // row-major lower triangle = column-major upper triangle
  const char jobz = 'V', uplo = 'U';
  int info = 0, lwork = -1, liwork = -1, iwork_size = 0;
  double work_size = 0.0;
  dsyevd_(&jobz, &uplo, &n, z.data(), &n, w.data(), &work_size, &lwork, &iwork_size, &liwork,
          &info);
  AP_CHECK(info == 0, "dsyevd workspace query of a {} x {} matrix: info = {}", n, n, info);
  lwork = static_cast<int>(work_size);
  liwork = iwork_size;
  std::vector<double> work(static_cast<size_t>(lwork));
  std::vector<int> iwork(static_cast<size_t>(liwork));
  dsyevd_(&jobz, &uplo, &n, z.data(), &n, w.data(), work.data(), &lwork, iwork.data(), &liwork,
          &info);
  AP_CHECK(info == 0, "dsyevd of a {} x {} matrix did not converge: info = {}", n, n, info);
  // column k of z (column-major) is eigenvector k: q's column k (row-major)
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < n; ++k)
      q[static_cast<size_t>(i) * n + k] = static_cast<float>(z[i + static_cast<size_t>(k) * n]);
}

namespace {

// into the basis (out = Q_Lᵀ·x·Q_R) or back (out = Q_L·x·Q_Rᵀ) for the rows [r0, r1) of a
// rows × cols matrix; x, tmp and out point at row r0 of theirs (tmp is scratch); a side without
// a basis is I. A block-diagonal Q_L maps each block of rows by its block (r0 and r1 are block
// bounds); a block-diagonal Q_R each block of columns.
void rotate(Context& ctx, const RotationShape& s, const RotationState& st, bool into, int r0,
            int r1, const float* x, float* tmp, float* out) {
  const int c = s.cols;
  const float* left = x;
  if (s.left) {
    float* dst = s.right ? tmp : out;
    for_blocks_on(ctx, s.rows, s.left_block, r0, r1, [&](int first, int k, size_t at) {
      const size_t row = static_cast<size_t>(first - r0) * c;
      gemm(ctx, into, false, k, c, k, 1.0f, st.left_basis + at, k, x + row, c, 0.0f, dst + row, c);
    });
    left = dst;
  }
  if (s.right)
    for_blocks_on(ctx, c, s.right_block, 0, c, [&](int first, int k, size_t at) {
      gemm(ctx, false, !into, r1 - r0, k, k, 1.0f, left + first, c, st.right_basis + at, k, 0.0f,
           out + first, c);
    });
}

}  // namespace

namespace {

// The calling thread's scratch of the rotated update, grown to the largest request and kept:
// a fresh allocation per update of a large matrix came from the system each time and paid a
// page fault for every page it touched.
// The update's element-wise passes over [b, e), each a function of its own with its operands
// as values and its arrays unaliased, so that gcc vectorises it (inside the lambdas it did
// not: a store through a float pointer might have changed a captured float); vector square
// roots and divisions round as the scalar ones do, so the bits are the same.
void scaled(const float* __restrict x, float scale, float* __restrict out, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i) out[i] = x[i] * scale;
}

// M' (in the basis) = lerp(M', G', 1 − β1), v = β2·v + (1−β2)·G'², and U' (into u):
// (on_m·M' + on_g·G') / (√v/√bc2 + ε)
void rotated_step(const float* __restrict gr, float* __restrict mr, float* __restrict v,
                  float* __restrict u, float one_minus_b1, float b2, float bc2_sqrt, float eps,
                  float on_m, float on_g, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i) {
    const float gi = gr[i];
    const float mi = std::fma(one_minus_b1, gi - mr[i], mr[i]);
    const float vi = b2 * v[i] + (1.0f - b2) * (gi * gi);
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    u[i] = (on_m * mi + on_g * gi) / denom;
    mr[i] = mi;
    v[i] = vi;
  }
}

// W = W·(1 − lr·wd) − (the step brought back)
void step_back(float* __restrict w, const float* __restrict back, float decay, int64_t b,
               int64_t e) {
  for (int64_t i = b; i < e; ++i) w[i] = w[i] * decay - back[i];
}

// the direction in the basis (into out): (M'/bc1) / (√v/bc2_sqrt + ε)
void rotated_direction(const float* __restrict mr, const float* __restrict v, float bc1,
                       float bc2_sqrt, float eps, float* __restrict out, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i) out[i] = (mr[i] / bc1) / (std::sqrt(v[i]) / bc2_sqrt + eps);
}

float* update_scratch(size_t floats) {
  thread_local std::unique_ptr<float[]> buffer;
  thread_local size_t capacity = 0;
  if (floats > capacity) {
    buffer = std::make_unique_for_overwrite<float[]>(floats);
    capacity = floats;
  }
  return buffer.get();
}

}  // namespace

int rotation_panel_rows(const RotationShape& shape, long panel_rows) {
  AP_CHECK(panel_rows >= 0, "rotation_panel_rows: panel_rows {}, must be >= 0", panel_rows);
  // where gemm never splits a product, neither is a rotation split into panels
  if (gemm_row_align() == 0) return shape.rows;
  // a panel starts at a block of the rows' side and where gemm's pieces may start (kGemmRowAlign
  // is a multiple of gemm_row_align())
  const int unit = shape.left ? std::lcm(shape.left_block, kGemmRowAlign) : kGemmRowAlign;
  if (unit >= shape.rows) return shape.rows;
  long fewest = unit;
  if (shape.right) {
    // the columns' side's products, panel by panel, stay on gemm's blocked path as the whole
    // matrix's do (or the matrix is one panel): each at least kGemmMinPieceMNK, its smallest
    // block included
    int smallest = shape.cols;
    for_blocks(shape.cols, shape.right_block,
               [&](int, int k, size_t) { smallest = std::min(smallest, k); });
    const double per_row = static_cast<double>(smallest) * smallest;
    if (shape.rows * per_row < kGemmMinPieceMNK) return shape.rows;
    const long rows = static_cast<long>(std::ceil(kGemmMinPieceMNK / per_row));
    fewest = std::max<long>(fewest, (rows + unit - 1) / unit * unit);
  }
  const long wanted =
      panel_rows > 0 ? panel_rows : kRotationPanelFloats / (3L * static_cast<long>(shape.cols));
  const long panel = std::max(fewest, wanted / unit * unit);
  return static_cast<int>(std::min<long>(panel, shape.rows));
}

void rotated_adamw_update(Context& ctx, float* params, const float* grads, float* m, float* v,
                          const RotationShape& shape, const RotationState& st, const AdamWParams& p,
                          long t, float grad_scale, const RotationStep& step) {
  AP_CHECK(t >= 1, "rotated_adamw_update: step t = {}, must be >= 1", t);
  AP_CHECK(shape.any(), "rotated_adamw_update: a {} x {} matrix with neither side rotating",
           shape.rows, shape.cols);
  AP_CHECK((shape.left == (st.left_cov != nullptr && st.left_basis != nullptr)) &&
               (shape.right == (st.right_cov != nullptr && st.right_basis != nullptr)),
           "rotated_adamw_update: the state does not match the sides that rotate");
  const int r = shape.rows, c = shape.cols;
  const int64_t n = static_cast<int64_t>(r) * c;
  const int panel = rotation_panel_rows(shape, step.panel_rows);
  const size_t pn = largest_panel_floats(shape, panel);
  const size_t lf = shape.left_floats(), rf = shape.right_floats();
  // per panel G' (then the step back), U' and the rotation's scratch; at a refresh the old
  // bases and the turn from them to the new (Q_oldᵀ·Q_new per block); G scaled (when
  // grad_scale ≠ 1, the whole matrix: R's product sums over every row). Not zeroed: every
  // element is written before it is read (the products write theirs with β = 0).
  const size_t turn_floats = step.refresh ? lf + rf : 0;
  float* const gr =
      update_scratch(3 * pn + 2 * turn_floats + (grad_scale != 1.0f ? static_cast<size_t>(n) : 0));
  float* const ur = gr + pn;
  float* const tmp = ur + pn;
  float* const old = tmp + pn;
  float* const turn = old + turn_floats;
  const float* gs = grads;
  if (grad_scale != 1.0f) {
    float* const g = turn + turn_floats;
    ctx.parallel_for(n, [&](int, int64_t b, int64_t e) { scaled(grads, grad_scale, g, b, e); });
    gs = g;
  }
  if (step.refresh) {
    if (shape.left) std::copy_n(st.left_basis, lf, old);
    if (shape.right) std::copy_n(st.right_basis, rf, old + lf);
  }
  const float b1 = p.beta1, b2 = p.beta2;
  if (shape.left)
    for_blocks_on(ctx, r, shape.left_block, 0, r, [&](int first, int k, size_t at) {
      const float* rows = gs + static_cast<size_t>(first) * c;
      gemm(ctx, false, true, k, k, c, 1.0f - b2, rows, c, rows, c, b2, st.left_cov + at, k);
      if (!step.refresh) return;
      symmetric_eigenvectors(st.left_cov + at, k, st.left_basis + at);
      gemm(ctx, true, false, k, k, k, 1.0f, old + at, k, st.left_basis + at, k, 0.0f, turn + at, k);
    });
  if (shape.right)
    for_blocks_on(ctx, c, shape.right_block, 0, c, [&](int first, int k, size_t at) {
      gemm(ctx, true, false, k, k, r, 1.0f - b2, gs + first, c, gs + first, c, b2,
           st.right_cov + at, k);
      if (!step.refresh) return;
      symmetric_eigenvectors(st.right_cov + at, k, st.right_basis + at);
      gemm(ctx, true, false, k, k, k, 1.0f, old + lf + at, k, st.right_basis + at, k, 0.0f,
           turn + lf + at, k);
    });
  // M' from the old basis into the new: Q_newᵀ·Q_old·M'·Q_oldᵀ·Q_new, rotate's "into" with the
  // turns as the bases (at the first update the old bases, and M', are zero)
  RotationState turned;
  if (shape.left) turned.left_basis = turn;
  if (shape.right) turned.right_basis = turn + lf;

  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b1), t));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(b2), t));
  const float bc2_sqrt = std::sqrt(bc2), eps = p.eps;
  const NadamSteps k =
      step.lookahead ? nadam_steps(p.lr, b1, t, step.momentum_decay) : NadamSteps{p.lr / bc1, 0.0f};
  const float decay = 1.0f - p.lr * p.weight_decay;
  for_panels(r, panel, [&](int r0, int r1) {
    const size_t at = static_cast<size_t>(r0) * static_cast<size_t>(c);
    const int64_t pe = static_cast<int64_t>(r1 - r0) * c;
    float* const mp = m + at;
    float* const vp = v + at;
    float* const wp = params + at;
    rotate(ctx, shape, st, true, r0, r1, gs + at, tmp, gr);
    if (step.refresh) {
      rotate(ctx, shape, turned, true, r0, r1, mp, tmp, ur);
      std::copy_n(ur, pe, mp);
    }
    // M' and v in the basis, U' (into ur)
    ctx.parallel_for(pe, [&](int, int64_t b, int64_t e) {
      rotated_step(gr, mp, vp, ur, 1.0f - b1, b2, bc2_sqrt, eps, k.on_m, k.on_g, b, e);
    });
    rotate(ctx, shape, st, false, r0, r1, ur, tmp, gr);
    ctx.parallel_for(pe, [&](int, int64_t b, int64_t e) { step_back(wp, gr, decay, b, e); });
  });
}

namespace {

// rotated_adamw_direction's work for the rows [r0, r1): into `out` (row r0 of the direction),
// with dr and tmp (a panel each) as scratch
void direction_rows(Context& ctx, const float* m, const float* v, const RotationShape& shape,
                    const RotationState& st, float bc1, float bc2_sqrt, float eps, int r0, int r1,
                    float* dr, float* tmp, float* out) {
  const size_t at = static_cast<size_t>(r0) * static_cast<size_t>(shape.cols);
  const int64_t pe = static_cast<int64_t>(r1 - r0) * shape.cols;
  const float* const mp = m + at;
  const float* const vp = v + at;
  ctx.parallel_for(pe, [&](int, int64_t b, int64_t e) {
    rotated_direction(mp, vp, bc1, bc2_sqrt, eps, dr, b, e);
  });
  rotate(ctx, shape, st, false, r0, r1, dr, tmp, out);
}

}  // namespace

void rotated_adamw_direction(Context& ctx, const float* m, const float* v,
                             const RotationShape& shape, const RotationState& st, float bc1,
                             float bc2_sqrt, float eps, float* out, long panel_rows) {
  AP_CHECK(shape.any(), "rotated_adamw_direction: a {} x {} matrix with neither side rotated",
           shape.rows, shape.cols);
  const int panel = rotation_panel_rows(shape, panel_rows);
  // the direction in the basis and the rotation's scratch, per panel, in the calling thread's
  // scratch as the update's
  const size_t pn = largest_panel_floats(shape, panel);
  float* const dr = update_scratch(2 * pn);
  float* const tmp = dr + pn;
  for_panels(shape.rows, panel, [&](int r0, int r1) {
    direction_rows(ctx, m, v, shape, st, bc1, bc2_sqrt, eps, r0, r1, dr, tmp,
                   out + static_cast<size_t>(r0) * static_cast<size_t>(shape.cols));
  });
}

void rotated_xpipe_predict(Context& ctx, float* out, const float* w, const float* m, const float* v,
                           const RotationShape& shape, const RotationState& state,
                           const WeightPrediction& p) {
  AP_CHECK(shape.any(), "rotated_xpipe_predict: a {} x {} matrix with neither side rotated",
           shape.rows, shape.cols);
  // panel by panel, the direction in the thread's scratch (a third panel) and the prediction
  // from it: the bits of rotated_adamw_direction's whole direction
  const int panel = rotation_panel_rows(shape);
  const size_t pn = largest_panel_floats(shape, panel);
  float* const dr = update_scratch(3 * pn);
  float* const tmp = dr + pn;
  float* const d = tmp + pn;
  for_panels(shape.rows, panel, [&](int r0, int r1) {
    const size_t at = static_cast<size_t>(r0) * static_cast<size_t>(shape.cols);
    direction_rows(ctx, m, v, shape, state, p.bc1, p.bc2_sqrt, p.eps, r0, r1, dr, tmp, d);
    xpipe_predict_along(ctx, out + at, w + at, d, static_cast<int64_t>(r1 - r0) * shape.cols, p);
  });
}

void xpipe_predict_along(Context& ctx, float* out, const float* w, const float* d, int64_t n,
                         const WeightPrediction& p) {
  const float k = p.k, wd = p.wd;
  ctx.parallel_for(n, [&](int, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = w[i] - k * (d[i] + wd * w[i]);
  });
}

}  // namespace actorpipe
