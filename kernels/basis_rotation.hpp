// AdamW in a rotated basis (basis rotation; docs/modes.md, "Basis rotation"): the second moment of
// a matrix parameter is kept in the eigenbasis of its gradients' covariances instead of the
// coordinate basis, where AdamW's element-wise step oscillates and a late gradient does the
// most harm (Jung, Shin and Lee, "Mitigating Staleness in Asynchronous Pipeline Parallelism
// via Basis Rotation", ICML 2026; the same rotation as SOAP's). The products are the Context's
// GEMMs and the eigenvectors LAPACK's dsyevd, each whole on one thread (a side's blocks spread
// over the Context's threads), so the bits do not depend on the thread count.
#pragma once

#include <cstddef>

#include "kernels/context.hpp"
#include "kernels/optimizer.hpp"

namespace actorpipe {

/// A matrix parameter's (rows × cols, row-major) rotation: which sides rotate (a side rotates
/// when its dimension is at most the limit, `optimizer.rotation_max_dim`) and in blocks of how
/// many (`optimizer.rotation_block`). A side of n split in blocks of b has a block-diagonal
/// covariance and basis: blocks of b × b (the last n − ⌊n/b⌋·b when b does not divide n), the
/// diagonal blocks of the whole side's; each block's matrix follows the one before it in
/// memory, block i at i·b² floats. A side in one block (b ≥ n) is the whole side.
struct RotationShape {
  int rows = 0;
  int cols = 0;
  bool left = false;    ///< rotate the rows' side: L = EMA(G·Gᵀ), rows × rows
  bool right = false;   ///< rotate the columns' side: R = EMA(Gᵀ·G), cols × cols
  int left_block = 0;   ///< the rows' side's block (rows when whole)
  int right_block = 0;  ///< the columns' side's block (cols when whole)

  bool any() const { return left || right; }
  /// Floats of one rows' side matrix (rows² whole, the blocks' squares in blocks, or 0 when
  /// the left side does not rotate).
  size_t left_floats() const;
  /// Floats of one columns' side matrix (as left_floats, for the columns).
  size_t right_floats() const;
  /// Floats of the rotation's state: L and its eigenvectors Q_L (left_floats() each, when
  /// left), R and Q_R (right_floats() each, when right).
  size_t state_floats() const;
};

/// rows × cols with each side rotated when it is at most max_dim (and above 0), in blocks of
/// `block` (0, or a block at least the side's dimension: the whole side).
RotationShape rotation_shape(long rows, long cols, long max_dim, long block = 0);

/// The rotation's state, in this order in memory (state_floats() floats; nullptr for a side
/// that does not rotate): the two covariances, then their eigenvectors (orthonormal columns,
/// row-major, in LAPACK's ascending order of eigenvalues; in blocks, each block's): L at 0, R
/// at left_floats(), Q_L at left_floats() + right_floats(), Q_R at 2·left_floats() +
/// right_floats().
struct RotationState {
  float* left_cov = nullptr;
  float* right_cov = nullptr;
  float* left_basis = nullptr;
  float* right_basis = nullptr;
};

/// The state's arrays in `state` (state_floats() floats, starting zeroed) for `shape`.
RotationState rotation_state(const RotationShape& shape, float* state);

/// What an update of the rotated rule takes besides AdamW's parameters.
struct RotationStep {
  /// Recompute the eigenvectors (from the covariances after this update's gradient) before
  /// rotating: every `optimizer.rotation_every` updates, counting from the first.
  bool refresh = false;
  /// Nesterov's look-ahead (NAdam, as adamw_update's nesterov) in the rotated basis.
  bool lookahead = false;
  float momentum_decay = 0.0f;  ///< the look-ahead's ψ (nadam_steps)
  /// Rows per panel of the update's rotations and element-wise passes (0: the kernel's choice,
  /// rotation_panel_rows). Any value gives the same bits; tests set it to force several panels.
  long panel_rows = 0;
};

/// The rotated update works through a large matrix in panels of rows, its scratch 3 floats per
/// element of a panel (the last panel takes the rest, up to twice a panel): about this many
/// floats, 16 MB, where a panel may be that small, instead of 3 per element of the matrix (a
/// GPT-2 embedding, 50257 × 768 with its columns rotating whole, 463 MB; in blocks of 32 its
/// panels are 8256 rows, so that each product stays on gemm's blocked path).
inline constexpr long kRotationPanelFloats = 4L << 20;

/// The rows of the update's panels for `shape`: `panel_rows` (0: as many as keep the 3 panels
/// within kRotationPanelFloats) rounded down to a multiple of the rows' side's block and of
/// kGemmRowAlign, and at least as many as keep each product of the columns' side at
/// kGemmMinPieceMNK (its smallest block's); the whole matrix when those are not below its rows
/// (a rows' side that rotates whole, at most rotation_max_dim rows) or its products are below
/// kGemmMinPieceMNK already. Each panel then computes the whole matrix's bits.
int rotation_panel_rows(const RotationShape& shape, long panel_rows = 0);

/// One update of a matrix parameter (shape.any()) at step t (1-based), G = grad_scale·grads:
///   L = β2·L + (1−β2)·G·Gᵀ,  R = β2·R + (1−β2)·Gᵀ·G        (the sides that rotate; in blocks,
///                                                            the diagonal blocks only)
///   refresh: Q_L, Q_R = the eigenvectors of L, R             (dsyevd in double, rounded)
///            M' = (Q_Lᵀ·Q_L,old)·M'·(Q_R,oldᵀ·Q_R)          (M' into the new basis)
///   G' = Q_Lᵀ·G·Q_R                                          (a side that does not rotate: I)
///   M' = β1·M' + (1−β1)·G'                                   (AdamW's m, in the rotated basis)
///   v  = β2·v + (1−β2)·G'²                                   (in the rotated basis)
///   U' = (lr/(1−β1ᵗ))·M' / (√v/√(1−β2ᵗ) + ε)
///        look-ahead: (on_m·M' + on_g·G') / (√v/√(1−β2ᵗ) + ε)   (nadam_steps)
///   W = W·(1 − lr·wd) − Q_L·U'·Q_Rᵀ
/// `m` holds M', the first moment in the rotated basis (AdamW's m in the coordinates is
/// Q_L·M'·Q_Rᵀ: the same rule in exact arithmetic as keeping m in the coordinates and rotating
/// it at every update, at two products fewer), v the second; W is in the parameter's
/// coordinates. Element-wise steps are float as adamw_update's; the products are gemm's. After
/// the covariances, everything is computed panel by panel of rotation_panel_rows rows (the same
/// bits for any panel). The calling thread keeps a scratch of 3 floats per element of a panel
/// (and 1 per element of the matrix with grad_scale ≠ 1, the scaled gradient the covariances
/// read; at a refresh 2 per element of the bases), the largest it needed, for the next update.
void rotated_adamw_update(Context& ctx, float* params, const float* grads, float* m, float* v,
                          const RotationShape& shape, const RotationState& state,
                          const AdamWParams& p, long t, float grad_scale, const RotationStep& step);

/// AdamW's step direction in the rotated basis, brought back to the coordinates (XPipe's weight
/// prediction with basis rotation): out = Q_L·((M'/bc1) / (√v/bc2_sqrt + ε))·Q_Rᵀ, from the
/// state an update left (`m` holding M', v, the eigenvectors). In panels of
/// rotation_panel_rows(shape, panel_rows) rows (the same bits for any), in the calling thread's
/// scratch as rotated_adamw_update's: 2 floats per element of a panel.
void rotated_adamw_direction(Context& ctx, const float* m, const float* v,
                             const RotationShape& shape, const RotationState& state, float bc1,
                             float bc2_sqrt, float eps, float* out, long panel_rows = 0);

/// XPipe's weight prediction for a matrix that rotates (xpipe_predict's AdamW formula with the
/// rotated direction): out = w − p.k·(d + p.wd·w), d = rotated_adamw_direction(m, v, p.bc1,
/// p.bc2_sqrt, p.eps). Element-wise in float, without fused multiply-adds.
void rotated_xpipe_predict(Context& ctx, float* out, const float* w, const float* m, const float* v,
                           const RotationShape& shape, const RotationState& state,
                           const WeightPrediction& p);

/// rotated_xpipe_predict's last step, from a direction d computed before (by
/// rotated_adamw_direction with p's bc1, bc2_sqrt and eps): out = w − p.k·(d + p.wd·w), n
/// floats, the same bits.
void xpipe_predict_along(Context& ctx, float* out, const float* w, const float* d, int64_t n,
                         const WeightPrediction& p);

/// The eigenvectors of the symmetric n × n matrix a (row-major; its lower triangle is read) as
/// the columns of q (row-major), in ascending order of eigenvalues: LAPACK's dsyevd in double
/// on the calling thread.
void symmetric_eigenvectors(const float* a, int n, float* q);

}  // namespace actorpipe
