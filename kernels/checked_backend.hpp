// CheckedBackend: the CPU backend's compute on memory of its own, held to a device backend's
// rules, so that code written for a device (the CUDA backend) can be tested where no device is.
//
// - Every float pointer an op takes must lie, with the whole extent the op reads or writes,
//   inside one of the backend's live allocations or scratch blocks; every index array (tokens,
//   segments, targets, rows, the key mask) must lie outside them. A breach is a CheckFailure
//   naming the op, the argument and its extent.
// - Between ops the backend's memory is inaccessible (mprotect PROT_NONE, with guard on): host
//   code that reads or writes it other than through to_host / to_backend / copy faults, and the
//   process stops with a message naming the address. Only the op's own calls (the CPU kernels, on
//   the Context's threads) see the memory, while they run.
//
// It computes the CPU backend's bits. It is a testing backend: slower (two mprotect calls per
// allocation per op) and for one thread of callers at a time.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/compute_backend.hpp"

namespace actorpipe {

class Context;

class CheckedBackend final : public ComputeBackend {
 public:
  /// The CPU kernels on `ctx` (which must outlive the backend). `guard`: the memory is
  /// inaccessible between ops (else only the pointer checks).
  explicit CheckedBackend(Context& ctx, bool guard = true);
  /// Another CheckedBackend on the same memory (CheckFailures and the guard alike), on `ctx`'s
  /// threads; every op of either runs under one lock.
  std::unique_ptr<ComputeBackend> companion(Context& ctx) override;
  ~CheckedBackend() override;

  /// Whether p lies in the backend's memory (an allocation or a scratch block).
  bool owns(const void* p) const;
  /// Live allocations and scratch blocks.
  size_t regions() const;
  /// Ops run so far (memory transfers included).
  long ops() const;

  Device device() const override { return Device::cpu; }
  /// False: the layers treat it as a device (no CPU kernel on its memory, no fused host paths).
  bool host_memory() const override { return false; }
  std::string name() const override;
  Precision precision() const override;
  void set_precision(Precision p) override;

  float* allocate(size_t n) override;
  void release(float* p) override;
  float* scratch(size_t n) override;
  void reset_scratch() override;
  void to_backend(float* dst, const float* src, size_t n) override;
  void to_host(float* dst, const float* src, size_t n) override;
  void copy(float* dst, const float* src, size_t n) override;
  void synchronize() override {}
  /// Guarded pages of the process's own (closed except during their transfers), shared by every
  /// CheckedBackend: a stage's outputs in flight.
  BackendMemory& lasting_memory() override;

  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int C, int OC) override;
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int C, int OC) override;
  void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C,
                             int OC) override;
  void matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                              int N, int C, int OC) override;
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C) override;
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override;
  void gelu_forward(float* out, const float* inp, long N) override;
  void gelu_backward(float* dinp, const float* inp, const float* dout, long N) override;
  void attention_forward(float* out, float* att, const float* qkv, const uint8_t* key_mask,
                         bool causal, int B, int T, int C, int NH) override;
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                          const float* att, int B, int T, int C, int NH, bool causal) override;
  int crossentropy_forward(float* losses, float* probs, const float* logits, const int32_t* targets,
                           int N, int V) override;
  int crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                    const int32_t* targets, float dloss, int N, int V) override;
  double sum_losses(const float* losses, int N) override;
  void encoder_forward(float* out, const int32_t* tokens, const int32_t* segments, const float* wte,
                       const float* wpe, const float* wse, int B, int T, int C) override;
  void encoder_backward(float* dwte, float* dwpe, float* dwse, const float* dout,
                        const int32_t* tokens, const int32_t* segments, int B, int T,
                        int C) override;
  void residual_forward(float* out, const float* a, const float* b, long N) override;
  void residual_backward(float* da, float* db, const float* dout, long N) override;
  void accumulate(float* dst, const float* src, long N) override;
  void fill_zero(float* dst, long N) override;
  void scale_inplace(float* dst, float s, long N) override;
  void gather_rows(float* out, const float* x, const int32_t* rows, int n, int C) override;
  void scatter_rows(float* out, const float* x, const int32_t* rows, int n, int C) override;
  void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                    const AdamWParams& p, long t, float grad_scale,
                    const DelayCorrection& correction) override;
  void sgd_update(float* params, const float* grads, float* momentum_buf, size_t n,
                  const SGDParams& p, float grad_scale, const DelayCorrection& correction) override;
  void xpipe_predict(float* out, const float* w, const float* m, const float* v, size_t n,
                     const WeightPrediction& p) override;
  double grad_sumsq(const float* grads, size_t n) override;

 private:
  class Op;  // one op: checks its arguments, opens the memory while it runs
  struct Region {
    size_t bytes = 0;                            // what was asked for
    size_t mapped = 0;                           // whole pages
    const CheckedBackend* scratch_of = nullptr;  // whose scratch block it is; null: an allocation
  };
  // the memory a backend shares with its companions: one lock for every op of them all (an op
  // opens the whole memory while it runs), the regions, unmapped when the last of them goes
  struct Shared {
    std::recursive_mutex mu;
    std::map<const char*, Region> regions;  // by base address
    ~Shared();
  };
  CheckedBackend(Context& ctx, bool guard, std::shared_ptr<Shared> shared);
  float* map(size_t n, bool scratch);
  void unmap(std::map<const char*, Region>::iterator it);
  void protect(int prot);

  std::unique_ptr<ComputeBackend> cpu_;
  bool guard_;
  std::shared_ptr<Shared> shared_;
  std::map<const char*, Region>& regions_;  // shared_->regions
  long ops_ = 0;
};

}  // namespace actorpipe
