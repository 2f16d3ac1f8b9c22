// The row split of gemm() and gemm_bf16(): a product of M output rows runs as one call on the
// caller, or as one call per piece of rows, the pieces taken by the Context's threads as they
// become free (Context::parallel_tasks: a faster thread computes more of them). Pieces start at
// multiples of `align`, up to kPiecesPerThread per thread, each with at least `min_piece`
// multiply-adds; they depend on M, align and the thread count only, never on which thread runs
// them, so the bits are the same from run to run.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/context.hpp"

namespace actorpipe::internal {

/// How many pieces split_rows cuts M rows into (1: the product runs whole): up to
/// `per_thread` per thread.
inline int row_pieces(int threads, int M, int align, double nk, double min_piece, int per_thread) {
  if (threads <= 1) return 1;
  const int64_t units = (static_cast<int64_t>(M) + align - 1) / align;
  int pieces = static_cast<int>(std::min<int64_t>(units, int64_t{threads} * per_thread));
  while (pieces > 1 &&
         static_cast<double>(smallest_aligned_chunk(M, align, pieces)) * nk < min_piece)
    --pieces;
  return pieces;
}

/// Calls fn(m0, rows) for [0, M) whole or in pieces; `nk` is N·K, the multiply-adds of a row.
template <class F>
void split_rows(Context& ctx, int M, int align, double nk, double min_piece, int per_thread,
                F&& fn) {
  const int pieces = row_pieces(ctx.threads(), M, align, nk, min_piece, per_thread);
  if (pieces <= 1) {
    fn(0, M);
    return;
  }
  const int64_t units = (static_cast<int64_t>(M) + align - 1) / align;
  ctx.parallel_tasks(pieces, [&](int, int64_t p) {
    const int64_t b = std::min<int64_t>(M, units * p / pieces * align);
    const int64_t e = std::min<int64_t>(M, units * (p + 1) / pieces * align);
    if (b < e) fn(static_cast<int>(b), static_cast<int>(e - b));
  });
}

}  // namespace actorpipe::internal
