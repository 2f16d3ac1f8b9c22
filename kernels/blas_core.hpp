// Which OpenBLAS kernels run the fp32 products here, and whether they fall short of this CPU.
// OpenBLAS (Debian's is built with DYNAMIC_ARCH) picks its kernels by the CPU's model number when
// it loads. On a processor it does not know (a virtual machine's "Intel(R) Xeon(R) Processor",
// say) it can fall back to its SSE3 kernels, Prescott, on a CPU with AVX-512: measured on an Intel
// Xeon with AMX, the GPT small step's fp32 products took 8.7 s instead of 1.3 s. OpenBLAS makes
// the choice before main(), reading OPENBLAS_CORETYPE; use_fitting_blas_core() makes it again
// in the running process (through OpenBLAS's own gotoblas_dynamic_quit/init, found at run time)
// where OPENBLAS_CORETYPE is unset. The trainers and actorpipe-bench call it first thing, and
// print the warning below where the kernels still fall short.
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
  std::string name;  ///< openblas_get_corename(), e.g. "Cooperlake"
  /// The core OpenBLAS picked when it loaded, where use_fitting_blas_core() replaced it (else
  /// empty).
  std::string picked_at_load;
  std::string suggested;  ///< suggested_blas_core(name, cpu_vector_isa())
  /// "OpenBLAS Prescott kernels", or "OpenBLAS SkylakeX kernels (chosen at start: OpenBLAS
  /// picked Prescott, narrower than this CPU)"
  std::string describe() const;
  /// Empty, or: "OpenBLAS picked its Prescott kernels (SSE) on a CPU with AVX-512: fp32 matrix
  /// products run several times slower than they can here; start with OPENBLAS_CORETYPE=SkylakeX"
  /// (and " (it is set to X)" where OPENBLAS_CORETYPE was set); made by blas_core().
  const std::string& warning() const { return warning_text; }
  std::string warning_text;
};
/// The kernels this process's OpenBLAS runs now.
BlasCore blas_core();

/// Makes OpenBLAS run `core`'s kernels from now on (one of Prescott, Core2, Nehalem, Sandybridge,
/// Haswell, SkylakeX and Zen, any letter case, whose instructions this CPU has). OpenBLAS offers no
/// interface for it: this calls its gotoblas_dynamic_quit() and gotoblas_dynamic_init() (Debian's
/// build, with DYNAMIC_ARCH, exports both) with OPENBLAS_CORETYPE set for the call and restored
/// after. No other thread may be inside OpenBLAS meanwhile; products already split by
/// gemm_row_align() keep their bits only if the core is the one the row alignment was probed with
/// (call it before the first Context). Returns an empty string, or why nothing changed: the core is
/// not one of these or wider than the CPU, OpenBLAS lacks the two functions (a build without
/// DYNAMIC_ARCH) or that core's kernels, or it ended up on another core.
std::string switch_blas_core(std::string_view core);

/// Whether `core` is one switch_blas_core() may ask for (the list above, any letter case).
bool switchable_blas_core(std::string_view core);

/// What use_fitting_blas_core() does: the core to switch to, or empty (none suggested, or
/// OPENBLAS_CORETYPE is set: the user's choice stands).
std::string fitting_blas_core(const BlasCore& now, bool coretype_set);

/// Where OpenBLAS picked kernels narrower than this CPU and OPENBLAS_CORETYPE is unset, switches
/// to the suggested core (switch_blas_core). Call it at the start of a program, before any thread
/// computes. Returns "OpenBLAS picked its Prescott kernels (SSE) on a CPU with AVX-512; running
/// SkylakeX's" when it switched, else an empty string (and blas_core().warning() still says what
/// is wrong, if anything).
std::string use_fitting_blas_core();

}  // namespace actorpipe
