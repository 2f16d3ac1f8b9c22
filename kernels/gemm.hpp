// GEMM: row-major C = alpha * op(A) * op(B) + beta * C through OpenBLAS sgemm, partitioned
// over the Context's threads by blocks of output rows (each output element computed by one thread).
#pragma once

#include "kernels/context.hpp"

namespace actorpipe {

/// op(A) is (M, K), op(B) is (K, N), C is (M, N); lda/ldb/ldc are row strides.
/// Products too small to be worth splitting run on the caller. Every piece of a split
/// product stays on OpenBLAS's blocked path and starts at a row where every OpenBLAS kernel's
/// micro-tiles start, so the result per element does not depend on the block bounds: it is
/// bitwise the same for any thread count (checked by the tests against the installed OpenBLAS
/// and the kernel it picked for this CPU).
void gemm(Context& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha,
          const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc);

/// The same without partitioning (a single caller thread); used inside parallel regions.
void gemm_serial(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc);

}  // namespace actorpipe
