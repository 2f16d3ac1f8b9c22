// The CUDA backend: kernels/compute_backend.hpp on one GPU, one stream. Matrix products through
// cuBLAS in full fp32 (no TF32), the rest as .cu kernels. Deterministic: every reduction (bias and
// norm gradients, embedding gradients, softmax, the loss, the gradient norm) runs in a fixed order
// and no kernel adds floats atomically, so a run repeats its bits on the same GPU.
// Compiled only when the build has CUDA (ACTORPIPE_CUDA); without it, or without a usable GPU,
// make_cuda_backend is a CheckFailure that says why.
#pragma once

#include <memory>

#include "kernels/compute_backend.hpp"

namespace actorpipe {

/// The CUDA backend on GPU `device_index` (0-based). A CheckFailure naming the reason when the
/// build has no CUDA, no GPU is usable, or the index is out of range.
std::unique_ptr<ComputeBackend> make_cuda_backend(int device_index = 0);

/// Empty when make_cuda_backend(0) would work, else the reason it cannot (cheap: a device query,
/// no context is created when there is no GPU). The parity tests skip with this reason.
std::string cuda_unavailable_reason();

}  // namespace actorpipe
