// The CPU backend: every op forwards to the CPU kernel of the same name on the Context.
#include "kernels/cpu_backend.hpp"

#include <fmt/format.h>

#include "kernels/attention.hpp"
#include "kernels/check.hpp"
#include "kernels/context.hpp"
#include "kernels/crossentropy.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/encoder.hpp"
#include "kernels/gelu.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/matmul.hpp"
#include "kernels/optimizer.hpp"

namespace actorpipe {
namespace {

class CpuBackend final : public ComputeBackend {
 public:
  explicit CpuBackend(Context& ctx) : ctx_(ctx) {}

  Device device() const override { return Device::cpu; }
  Precision precision() const override { return ctx_.precision(); }
  void set_precision(Precision p) override { ctx_.set_precision(p); }
  std::string name() const override {
    return fmt::format("cpu ({} thread{})", ctx_.threads(), ctx_.threads() == 1 ? "" : "s");
  }

  std::unique_ptr<ComputeBackend> companion(Context& ctx) override {
    return make_cpu_backend(ctx);  // host memory: any CPU backend's ops take it
  }

  // the process's host memory (fill_zero, below, on the Context's threads)
  float* allocate(size_t n) override { return host_backend_memory().allocate(n); }
  void release(float* p) override { host_backend_memory().release(p); }
  float* scratch(size_t n) override { return ctx_.arena().alloc_f32(n); }
  void reset_scratch() override { ctx_.arena().reset(); }
  void to_backend(float* dst, const float* src, size_t n) override { copy(dst, src, n); }
  void to_host(float* dst, const float* src, size_t n) override { copy(dst, src, n); }
  void copy(float* dst, const float* src, size_t n) override {
    host_backend_memory().copy(dst, src, n);
  }
  void synchronize() override {}

  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int C, int OC) override {
    actorpipe::matmul_forward(ctx_, out, inp, weight, bias, N, C, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int C, int OC) override {
    actorpipe::matmul_backward(ctx_, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
  }
  void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C,
                             int OC) override {
    actorpipe::matmul_backward_input(ctx_, dinp, dout, weight, N, C, OC);
  }
  void matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                              int N, int C, int OC) override {
    actorpipe::matmul_backward_weight(ctx_, dweight, dbias, dout, inp, N, C, OC);
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C) override {
    actorpipe::layernorm_forward(ctx_, out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    actorpipe::layernorm_backward(ctx_, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void gelu_forward(float* out, const float* inp, long N) override {
    actorpipe::gelu_forward(ctx_, out, inp, N);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, long N) override {
    actorpipe::gelu_backward(ctx_, dinp, inp, dout, N);
  }
  void attention_forward(float* out, float* att, const float* qkv, const uint8_t* key_mask,
                         bool causal, int B, int T, int C, int NH) override {
    actorpipe::attention_forward(ctx_, out, att, qkv, key_mask, causal, B, T, C, NH);
  }
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                          const float* att, int B, int T, int C, int NH, bool causal) override {
    actorpipe::attention_backward(ctx_, dqkv, scratch, dout, qkv, att, B, T, C, NH, causal);
  }

  int crossentropy_forward(float* losses, float* probs, const float* logits, const int32_t* targets,
                           int N, int V) override {
    return actorpipe::crossentropy_forward(ctx_, losses, probs, logits, targets, N, V);
  }
  int crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                    const int32_t* targets, float dloss, int N, int V) override {
    return actorpipe::crossentropy_forward_backward(ctx_, losses, dlogits, logits, targets, dloss,
                                                    N, V);
  }
  double sum_losses(const float* losses, int N) override {
    return actorpipe::sum_losses(losses, N);
  }

  void encoder_forward(float* out, const int32_t* tokens, const int32_t* segments, const float* wte,
                       const float* wpe, const float* wse, int B, int T, int C) override {
    actorpipe::encoder_forward(ctx_, out, tokens, segments, wte, wpe, wse, B, T, C);
  }
  void encoder_backward(float* dwte, float* dwpe, float* dwse, const float* dout,
                        const int32_t* tokens, const int32_t* segments, int B, int T,
                        int C) override {
    actorpipe::encoder_backward(ctx_, dwte, dwpe, dwse, dout, tokens, segments, B, T, C);
  }

  void residual_forward(float* out, const float* a, const float* b, long N) override {
    actorpipe::residual_forward(ctx_, out, a, b, N);
  }
  void residual_backward(float* da, float* db, const float* dout, long N) override {
    actorpipe::residual_backward(ctx_, da, db, dout, N);
  }
  void accumulate(float* dst, const float* src, long N) override {
    actorpipe::accumulate(ctx_, dst, src, N);
  }
  void fill_zero(float* dst, long N) override { actorpipe::fill_zero(ctx_, dst, N); }
  void scale_inplace(float* dst, float s, long N) override {
    actorpipe::scale_inplace(ctx_, dst, s, N);
  }
  void gather_rows(float* out, const float* x, const int32_t* rows, int n, int C) override {
    actorpipe::gather_rows(ctx_, out, x, rows, n, C);
  }
  void scatter_rows(float* out, const float* x, const int32_t* rows, int n, int C) override {
    actorpipe::scatter_rows(ctx_, out, x, rows, n, C);
  }

  void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                    const AdamWParams& p, long t, float grad_scale,
                    const DelayCorrection& correction) override {
    actorpipe::adamw_update(ctx_, params, grads, m, v, n, p, t, grad_scale, correction);
  }
  void sgd_update(float* params, const float* grads, float* momentum_buf, size_t n,
                  const SGDParams& p, float grad_scale,
                  const DelayCorrection& correction) override {
    actorpipe::sgd_update(ctx_, params, grads, momentum_buf, n, p, grad_scale, correction);
  }
  void xpipe_predict(float* out, const float* w, const float* m, const float* v, size_t n,
                     const WeightPrediction& p) override {
    actorpipe::xpipe_predict(ctx_, out, w, m, v, n, p);
  }
  double grad_sumsq(const float* grads, size_t n) override {
    return actorpipe::grad_sumsq(ctx_, grads, n);
  }

 private:
  Context& ctx_;
};

}  // namespace

std::unique_ptr<ComputeBackend> make_cpu_backend(Context& ctx) {
  return std::make_unique<CpuBackend>(ctx);
}

}  // namespace actorpipe
