// The row split of gemm() and gemm_bf16(): a product of M output rows runs as one call on the
// caller, or as one call per block of rows over the Context's threads (blocks start at multiples
// of `align`, as parallel_for_aligned cuts them) when every block has at least `min_piece`
// multiply-adds.
#pragma once

#include <cstdint>

#include "kernels/context.hpp"

namespace actorpipe::internal {

/// Calls fn(m0, rows) for [0, M) whole or in blocks; `nk` is N·K, the multiply-adds of a row.
template <class F>
void split_rows(Context& ctx, int M, int align, double nk, double min_piece, F&& fn) {
  const double piece = static_cast<double>(smallest_aligned_chunk(M, align, ctx.threads())) * nk;
  if (ctx.threads() == 1 || piece < min_piece) {
    fn(0, M);
    return;
  }
  ctx.parallel_for_aligned(M, align, [&](int, int64_t b, int64_t e) {
    if (b < e) fn(static_cast<int>(b), static_cast<int>(e - b));
  });
}

}  // namespace actorpipe::internal
