// ComputeBackend: the one interface through which the layers reach compute, in the spirit of
// ggml-backend. Each forward/backward pair takes the arguments of the CPU kernel of the same name
// (kernels/matmul.hpp, layernorm.hpp, ...) in the same order, without the Context: a backend
// owns its compute budget (the CPU backend a Context's threads, the CUDA backend one device
// stream). The CPU backend is the reference; kernels/cuda/ holds the CUDA one.
//
// Memory: every float pointer an op takes is the backend's memory (host memory for the CPU
// backend, device memory for CUDA). Index arrays (tokens, segments, targets, rows, the key mask)
// are host memory for every backend: they come from the Microbatch, and a device backend stages
// them itself. A device backend's ops are asynchronous on its stream; sum_losses, to_host and
// synchronize wait for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/backend_memory.hpp"
#include "kernels/optimizer.hpp"
#include "kernels/precision.hpp"
#include "kernels/tensor.hpp"

namespace actorpipe {

class Context;

class ComputeBackend : public BackendMemory {
 public:
  /// What the products (the matmul ops, attention) compute in: fp32, or bf16 (their operands
  /// rounded to bf16 as they are read, round to nearest even, the products accumulated in f32:
  /// the CPU kernels' bf16 semantics with a copy per product). Every other op computes in f32
  /// either way. Set through Context::set_precision.
  virtual Precision precision() const = 0;
  virtual void set_precision(Precision p) = 0;

  /// A backend on the same device whose ops may read and write this backend's memory, with a
  /// compute budget of its own (the CPU backend's: `ctx`'s threads; a GPU's: a stream of its
  /// own): for another thread that works on buffers of this one (an optimizer shard updating its
  /// stage's weights). The two order their work only through the host: what one wrote is for
  /// the other to read after the writer's synchronize(). It must not outlive this backend.
  virtual std::unique_ptr<ComputeBackend> companion(Context& ctx) = 0;

  // ---- memory (BackendMemory: allocate, release, to_backend, to_host, copy, fill_zero,
  // synchronize) -------------------------------------------------------------------------------
  /// Scratch for one layer call: n floats (uninitialised) valid until reset_scratch().
  virtual float* scratch(size_t n) = 0;
  virtual void reset_scratch() = 0;

  // ---- linear layer (kernels/matmul.hpp) -----------------------------------------------------
  virtual void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                              int N, int C, int OC) = 0;
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, int N, int C, int OC) = 0;
  virtual void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N,
                                     int C, int OC) = 0;
  virtual void matmul_backward_weight(float* dweight, float* dbias, const float* dout,
                                      const float* inp, int N, int C, int OC) = 0;

  // ---- normalisation, activation, attention --------------------------------------------------
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int N, int C) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int N, int C) = 0;
  virtual void gelu_forward(float* out, const float* inp, long N) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, long N) = 0;
  /// key_mask: host memory (see above). The backward's scratch: B·NH·T·T floats (the CPU
  /// kernel needs threads·T·T of them; the CUDA backend all B·NH·T·T, one score matrix per
  /// head of every sequence, computed in one batched product).
  virtual void attention_forward(float* out, float* att, const float* qkv, const uint8_t* key_mask,
                                 bool causal, int B, int T, int C, int NH) = 0;
  virtual void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                  const float* att, int B, int T, int C, int NH, bool causal) = 0;

  // ---- loss -----------------------------------------------------------------------------------
  /// targets: host memory. Returns the number of counted rows (computed on the host).
  virtual int crossentropy_forward(float* losses, float* probs, const float* logits,
                                   const int32_t* targets, int N, int V) = 0;
  virtual int crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                            const int32_t* targets, float dloss, int N, int V) = 0;
  /// Σ losses[0, N) in double, in row order (waits for the ops before it).
  virtual double sum_losses(const float* losses, int N) = 0;

  // ---- embeddings (kernels/encoder.hpp); tokens, segments: host memory ------------------------
  virtual void encoder_forward(float* out, const int32_t* tokens, const int32_t* segments,
                               const float* wte, const float* wpe, const float* wse, int B, int T,
                               int C) = 0;
  virtual void encoder_backward(float* dwte, float* dwpe, float* dwse, const float* dout,
                                const int32_t* tokens, const int32_t* segments, int B, int T,
                                int C) = 0;

  // ---- element-wise (kernels/elementwise.hpp) --------------------------------------------------
  virtual void residual_forward(float* out, const float* a, const float* b, long N) = 0;
  virtual void residual_backward(float* da, float* db, const float* dout, long N) = 0;
  virtual void accumulate(float* dst, const float* src, long N) = 0;
  virtual void scale_inplace(float* dst, float s, long N) = 0;
  /// out (n,C) = rows `rows` (host) of x; out rows `rows` of (·,C) = x (n,C).
  virtual void gather_rows(float* out, const float* x, const int32_t* rows, int n, int C) = 0;
  virtual void scatter_rows(float* out, const float* x, const int32_t* rows, int n, int C) = 0;

  // ---- optimizer (kernels/optimizer.hpp) -------------------------------------------------------
  virtual void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                            const AdamWParams& p, long t, float grad_scale,
                            const DelayCorrection& correction) = 0;
  virtual void sgd_update(float* params, const float* grads, float* momentum_buf, size_t n,
                          const SGDParams& p, float grad_scale,
                          const DelayCorrection& correction) = 0;
  /// XPipe's weight prediction (kernels/optimizer.hpp, xpipe_predict): out = w − k·((m / bc1) /
  /// (sqrt(v) / bc2_sqrt + eps) + wd·w), or w − k·m when v is nullptr (SGD).
  virtual void xpipe_predict(float* out, const float* w, const float* m, const float* v, size_t n,
                             const WeightPrediction& p) = 0;
  /// Σ g² in double, in a fixed order (waits for the ops before it).
  virtual double grad_sumsq(const float* grads, size_t n) = 0;
};

}  // namespace actorpipe
