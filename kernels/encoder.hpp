// Token + position (+ optional segment) embedding.
// Shapes: B batch, T time, C channels, V vocabulary, maxT context length, S segment types.
#pragma once

#include <cstdint>

#include "kernels/context.hpp"

namespace actorpipe {

/// out (B,T,C) = wte[tokens] (V,C) + wpe[t] (maxT,C) [+ wse[segments] (S,C)].
/// `segments` and `wse` may both be null. Ids are not range-checked here (V and S are not
/// passed): the data loader validates them.
void encoder_forward(Context& ctx, float* out, const int32_t* tokens, const int32_t* segments,
                     const float* wte, const float* wpe, const float* wse, int B, int T, int C);

/// Accumulates (+=) into dwte (V,C), dwpe (maxT,C), dwse (S,C) (dwse null when unused).
/// Deterministic: every row of dwte is summed in (b, t) order, dwpe over b in order;
/// the work is split over channel slices, so the result is the same for any thread count.
void encoder_backward(Context& ctx, float* dwte, float* dwpe, float* dwse, const float* dout,
                      const int32_t* tokens, const int32_t* segments, int B, int T, int C);

}  // namespace actorpipe
