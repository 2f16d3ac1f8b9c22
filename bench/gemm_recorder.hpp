// GEMM recorder: captures every sgemm call a training step makes (on each thread of its
// Context, in order) and replays them alone, which times the GEMM-only floor of the step.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/bf16_gemm.hpp"
#include "kernels/context.hpp"
#include "kernels/tensor.hpp"

namespace actorpipe::bench {

/// One cblas_sgemm call: C = alpha·op(A)·op(B) + beta·C, op(A) (M,K), op(B) (K,N). The
/// pointers are the step's own operands.
struct SgemmCall {
  bool row_major = true;
  bool trans_a = false;
  bool trans_b = false;
  int M = 0, N = 0, K = 0;
  float alpha = 1.0f;
  const float* A = nullptr;
  int lda = 0;
  const float* B = nullptr;
  int ldb = 0;
  float beta = 0.0f;
  float* C = nullptr;
  int ldc = 0;
  /// A bf16 product (gemm_bf16_serial, pipeline.precision = "bf16"): its operands; alpha 1,
  /// beta 0 or 1 (accumulate), A and B above null.
  const bf16* A16 = nullptr;
  const bf16* B16 = nullptr;
  const float* bias = nullptr;
  bool is_bf16() const { return A16 != nullptr; }
  double flops() const { return 2.0 * M * N * K; }
};

/// Records the sgemm calls made by the threads of one Context while recording. The program
/// that links this file defines cblas_sgemm itself: every call the kernels make goes through
/// it and on to OpenBLAS's (found with dlsym(RTLD_NEXT)). The bf16 products come from the
/// kernels' observer (set_bf16_gemm_observer) while recording. At most one recorder records at a
/// time. The recorded pointers stay valid as long as the buffers of the step do.
class GemmRecorder {
 public:
  /// Learns which thread runs each chunk of ctx (chunk 0 is the caller).
  explicit GemmRecorder(Context& ctx);
  ~GemmRecorder();
  GemmRecorder(const GemmRecorder&) = delete;
  GemmRecorder& operator=(const GemmRecorder&) = delete;

  /// Forgets earlier calls and records from now on.
  void start();
  void stop();

  /// calls()[c]: the calls made by the thread that runs chunk c, in the order it made them.
  const std::vector<std::vector<SgemmCall>>& calls() const { return calls_; }
  /// Calls made while recording by threads that are not the Context's (none in a step).
  size_t foreign_calls() const { return foreign_.load(); }
  size_t total_calls() const;
  /// Σ 2·M·N·K over all recorded calls.
  double total_flops() const;

  /// Runs the recorded calls again, each on the thread that made it: chunk c of one
  /// parallel_for over the Context's threads replays calls()[c] back to back. There is no
  /// barrier between calls, so this is a lower bound of a GEMM-only step with the step's
  /// partition. Returns the wall time in seconds. Not while recording.
  ///
  /// The replay writes no buffer of the step: every float region a recorded call writes (its
  /// C) has a copy of its own, made at the first replay after recording, and every call's
  /// operands that lie in such a region are read from the copy. So a replay between two steps
  /// leaves the step's activations and gradient accumulators as they were, while its memory
  /// traffic is the step's: the same sizes, strides and reuse (a product reading what an earlier
  /// one wrote reads it from the copy, where that one wrote it).
  double replay();

  /// Bytes of the copies the replays write (0 before the first replay).
  size_t shadow_bytes() const { return shadow_bytes_; }
  /// Where the replays keep the step's float at p: its place in a copy, or p itself where no
  /// recorded call writes it (and before the first replay).
  const float* replayed(const float* p) const;

  /// Called by the interposed cblas_sgemm for every call while this recorder is active.
  void record(const SgemmCall& call);

 private:
  Context& ctx_;
  std::vector<pid_t> tids_;  // tids_[c] runs chunk c
  std::vector<std::vector<SgemmCall>> calls_;
  std::atomic<size_t> foreign_{0};
  bool recording_ = false;
  /// calls_ with their float pointers moved into the copies; empty until the first replay
  std::vector<std::vector<SgemmCall>> shadowed_;
  struct Shadow {
    uintptr_t begin = 0, end = 0;   ///< the step's bytes [begin, end)
    std::unique_ptr<Storage> copy;  ///< host memory holding them, allocated as the step's tensors
  };
  std::vector<Shadow> regions_;  ///< ascending, disjoint
  size_t shadow_bytes_ = 0;

  /// The place in a copy of `floats` floats from p, all inside one region; else p itself.
  const float* moved(const float* p, size_t floats) const;

  void make_shadows();
};

/// Calls OpenBLAS's cblas_sgemm directly (not recorded).
void real_sgemm(const SgemmCall& call);

/// True when the program's cblas_sgemm is the recording one (it was linked in and OpenBLAS's
/// own was found behind it).
bool sgemm_interposed();

}  // namespace actorpipe::bench
