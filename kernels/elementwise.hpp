// Element-wise helpers of the transformer block: residual add and its backward, gradient
// accumulation, zeroing and scaling. Partitioned on 16-element boundaries: bitwise the same
// for any thread count.
#pragma once

#include <cstdint>

#include "kernels/context.hpp"

namespace actorpipe {

/// out (N) = a (N) + b (N). out may alias a or b.
void residual_forward(Context& ctx, float* out, const float* a, const float* b, long N);

/// Accumulates (+=) dout (N) into da (N) and db (N).
void residual_backward(Context& ctx, float* da, float* db, const float* dout, long N);

/// dst (N) += src (N).
void accumulate(Context& ctx, float* dst, const float* src, long N);

/// dst (N) = 0.
void fill_zero(Context& ctx, float* dst, long N);

/// dst (N) *= s.
void scale_inplace(Context& ctx, float* dst, float s, long N);

/// out (n,C) = rows `rows` of x (·,C): out row r is x row rows[r]. Split over rows.
void gather_rows(Context& ctx, float* out, const float* x, const int32_t* rows, int n, int C);

/// Rows `rows` of out (·,C) = x (n,C): out row rows[r] is x row r (a copy; the other rows of out
/// are left as they are). The rows must be distinct. Split over rows.
void scatter_rows(Context& ctx, float* out, const float* x, const int32_t* rows, int n, int C);

}  // namespace actorpipe
