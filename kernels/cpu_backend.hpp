// The CPU backend: kernels/compute_backend.hpp on the CPU kernels, with a Context's threads and
// arena. The reference every other backend is held to; a Context makes one for itself
// (Context::backend()), so layers on a plain Context run exactly the CPU kernels.
#pragma once

#include <memory>

#include "kernels/compute_backend.hpp"

namespace actorpipe {

class Context;

/// The CPU kernels on `ctx` (which must outlive it): scratch is ctx.arena(), memory is 64-byte
/// aligned host memory.
std::unique_ptr<ComputeBackend> make_cpu_backend(Context& ctx);

}  // namespace actorpipe
