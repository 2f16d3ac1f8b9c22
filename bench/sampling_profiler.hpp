// Sampling profiler: every thread of the process is interrupted at a fixed wall-clock period
// and its instruction address recorded; addresses resolve to functions and kernel categories.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace actorpipe::bench {

/// Where the time of a training step goes, by the kernel that executes it.
enum class KernelCategory : uint8_t {
  gemm,       // the matrix products: OpenBLAS sgemm, oneDNN's bf16 kernels (attention's included)
  attention,  // attention outside its GEMMs: softmax and its backward
  layernorm,
  gelu,
  crossentropy,  // softmax cross-entropy over the vocabulary
  embedding,     // token + position lookup and its scatter-add backward
  optimizer,     // AdamW, gradient norm, clip, tied-gradient sum
  elementwise,   // residual adds, zero fills, accumulation
  bias,          // bias broadcast and bias gradient of the linear layers
  convert,       // f32 -> bf16 copies of the products' operands (pipeline.precision = bf16)
  threads,       // thread pool: dispatch, and spinning while other chunks finish
  blocked,       // in a system call: asleep (a pool thread waiting for work or for other
                 // chunks), or woken and waiting for a CPU
  libc,          // C/C++ runtime outside system calls: memcpy/memset, allocation
  other,         // everything else (layer glue, validation, unresolved addresses)
};
inline constexpr int kNumKernelCategories = 14;

std::string_view to_string(KernelCategory c);
/// The category whose to_string is `name`; false if there is none.
bool category_from_string(std::string_view name, KernelCategory& out);

/// Category of a function from its demangled name, the source file of a file-local symbol
/// (empty for global symbols) and the shared library it lives in (empty for the program).
KernelCategory classify(std::string_view demangled, std::string_view source_file,
                        std::string_view library);

/// One sample: the index of the thread (in SamplingProfiler::threads()), its address, and
/// whether it was blocked in a system call (x86-64: interrupted at or right after a
/// `syscall` instruction: asleep in the kernel, or woken and waiting for a CPU).
struct ProfileSample {
  int thread = -1;
  bool in_syscall = false;
  uintptr_t pc = 0;
};

/// Per-thread wall-clock sampling (one POSIX timer per thread, signal SIGPROF delivered to
/// that thread). A sleeping thread is sampled too: its samples land in the runtime function
/// it waits in. One profiler at a time per process.
class SamplingProfiler {
 public:
  /// Room for `capacity` samples; later samples are dropped (and counted).
  explicit SamplingProfiler(size_t capacity);
  ~SamplingProfiler();
  SamplingProfiler(const SamplingProfiler&) = delete;
  SamplingProfiler& operator=(const SamplingProfiler&) = delete;

  /// Starts sampling the threads `tids` (empty: every thread of the process, the calling
  /// one first) every `period`; threads()[i] is tids[i]. Returns false (and samples nothing)
  /// if timers are refused.
  bool start(std::chrono::microseconds period, std::vector<pid_t> tids = {});
  void stop();

  std::span<const ProfileSample> samples() const;
  const std::vector<pid_t>& threads() const { return tids_; }
  size_t dropped() const;

 private:
  std::vector<ProfileSample> buf_;
  std::vector<pid_t> tids_;
  std::vector<void*> timers_;
  size_t taken_ = 0;
  bool running_ = false;
};

/// A shorter form of a demangled name for tables: no argument lists, no anonymous
/// namespaces, and a kernel's parallel chunk named after the kernel.
std::string short_name(const std::string& demangled);

/// A function an address falls in.
struct ResolvedSymbol {
  std::string name;   // demangled (or "?" when unknown)
  std::string where;  // source file of a local symbol, library of a shared-library address
  KernelCategory category = KernelCategory::other;
};

/// Resolves addresses of this process: the program's own functions through its ELF symbol
/// table (local symbols included, with the source file they come from), shared-library
/// addresses through dladdr.
class Symbolizer {
 public:
  Symbolizer();
  ~Symbolizer();
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;
  /// False when the program's symbol table could not be read (stripped binary).
  bool has_program_symbols() const;
  const ResolvedSymbol& resolve(uintptr_t pc);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Time per category and thread group for the sampled steps.
struct ProfileReport {
  struct Row {
    KernelCategory category = KernelCategory::other;
    double caller_ms = 0.0;   // on the thread that runs the step (its wall time)
    double workers_ms = 0.0;  // Σ over the Context's other threads
  };
  struct Hot {
    std::string name, where;
    KernelCategory category = KernelCategory::other;
    double share = 0.0;  // of the samples of all threads not blocked in a system call
  };
  int steps = 0;
  double step_ms = 0.0;    // wall time of one sampled step
  double period_ms = 0.0;  // sampling period
  size_t samples = 0;
  size_t dropped = 0;
  int workers = 0;
  std::vector<Row> rows;     // one per category, in enum order
  std::vector<Hot> hottest;  // top functions over all threads, blocked samples left out
};

/// Turns the samples into per-step milliseconds: each thread's samples are shares of the
/// wall time `wall_ms` of the `steps` sampled steps. threads()[0] is the caller, the others
/// are the workers.
ProfileReport summarize_profile(const SamplingProfiler& prof, Symbolizer& sym, int steps,
                                double wall_ms, std::chrono::microseconds period, size_t top = 15);

}  // namespace actorpipe::bench
