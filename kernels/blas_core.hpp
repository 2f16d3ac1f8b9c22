// Which OpenBLAS kernels run the fp32 products here, and whether they fall short of this CPU.
// OpenBLAS (Debian's is built with DYNAMIC_ARCH) picks its kernels by the CPU's model number when
// it loads. On a processor it does not know (a virtual machine's "Intel(R) Xeon(R) Processor",
// say) it can fall back to its SSE3 kernels, Prescott, on a CPU with AVX-512: measured on an Intel
// Xeon with AMX, the GPT small step's fp32 products took 8.7 s instead of 1.3 s. The choice is
// made before main() and cannot be changed afterwards; OPENBLAS_CORETYPE set before the program
// starts overrides it. The trainers and actorpipe-bench print the warning below when it applies.
#pragma once

#include <string>
#include <string_view>

namespace actorpipe {

/// The widest vector instructions of a CPU, in the steps OpenBLAS's x86-64 kernels use.
enum class VectorIsa { sse, avx, avx2, avx512 };

/// This CPU's (cpuid, and whether the OS saves the registers: __builtin_cpu_supports).
VectorIsa cpu_vector_isa();

/// The instructions an OpenBLAS core's kernels use ("Prescott": sse, "Haswell" and "Zen": avx2,
/// "SkylakeX" and "Cooperlake": avx512, ...), compared without case; `known` is false for a name
/// not in the table.
struct CoreIsa {
  bool known = false;
  VectorIsa isa = VectorIsa::sse;
};
CoreIsa blas_core_isa(std::string_view core);

/// The OpenBLAS core to set with OPENBLAS_CORETYPE when `core`'s kernels use narrower vectors
/// than `cpu` has ("SkylakeX" for avx512, "Haswell" for avx2, "Sandybridge" for avx); empty when
/// the core fits the CPU or is not in the table.
std::string suggested_blas_core(std::string_view core, VectorIsa cpu);

struct BlasCore {
  std::string name;       ///< openblas_get_corename(), e.g. "Cooperlake"
  std::string suggested;  ///< suggested_blas_core(name, cpu_vector_isa())
  /// "OpenBLAS Prescott kernels"
  std::string describe() const;
  /// Empty, or: "OpenBLAS picked its Prescott kernels (SSE) on a CPU with AVX-512: fp32 matrix
  /// products run several times slower than they can here; start with OPENBLAS_CORETYPE=SkylakeX"
  /// (and " (it is set to X)" where OPENBLAS_CORETYPE was set); made once, by blas_core().
  const std::string& warning() const { return warning_text; }
  std::string warning_text;
};
/// The kernels this process's OpenBLAS runs, read once.
const BlasCore& blas_core();

}  // namespace actorpipe
