// RecordingBackend: a ComputeBackend that forwards every op to another and, while recording,
// keeps each matrix-product op of the linear layers (matmul_forward, matmul_backward and its two
// halves) with its arguments, so that they can be replayed alone: the GEMM-only floor of a step
// on any backend. While profiling, it times every op (a profile of the step by op).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/compute_backend.hpp"

namespace actorpipe::bench {

class RecordingBackend final : public ComputeBackend {
 public:
  explicit RecordingBackend(ComputeBackend& inner) : inner_(inner) {}

  void start() {
    calls_.clear();
    recording_ = true;
  }
  /// While on, every op waits for the backend before and after it and adds its time to its name's
  /// total (profile()): where a step's time goes, at the cost of a synchronisation per op.
  void set_profiling(bool on) { profiling_ = on; }
  struct OpTime {
    std::string op;
    int calls = 0;
    double ms = 0.0;
  };
  /// Totals per op name since the last clear_profile(), in the order the ops first ran.
  const std::vector<OpTime>& profile() const { return profile_; }
  void clear_profile() { profile_.clear(); }
  void stop() { recording_ = false; }
  /// Recorded products.
  size_t calls() const { return calls_.size(); }
  /// Model FLOPs of the recorded products (2·N·C·OC per product; a full backward is two).
  double flops() const;
  /// Runs every recorded product again, in order, on the inner backend, without its bias or bias
  /// gradient (the products alone: the GEMMs), on the step's own buffers (the accumulating ones
  /// change, which a timing does not mind), then waits for it.
  void replay();

  Device device() const override { return inner_.device(); }
  bool host_memory() const override { return inner_.host_memory(); }
  std::string name() const override { return inner_.name(); }
  std::unique_ptr<ComputeBackend> companion(Context& ctx) override {
    return inner_.companion(ctx);  // not recorded
  }
  Precision precision() const override { return inner_.precision(); }
  void set_precision(Precision p) override { inner_.set_precision(p); }
  float* allocate(size_t n) override { return inner_.allocate(n); }
  void release(float* p) override { inner_.release(p); }
  float* scratch(size_t n) override { return inner_.scratch(n); }
  void reset_scratch() override { inner_.reset_scratch(); }
  void to_backend(float* dst, const float* src, size_t n) override {
    inner_.to_backend(dst, src, n);
  }
  void to_host(float* dst, const float* src, size_t n) override { inner_.to_host(dst, src, n); }
  void copy(float* dst, const float* src, size_t n) override {
    timed("copy", [&] { inner_.copy(dst, src, n); });
  }
  void synchronize() override { inner_.synchronize(); }

  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int C, int OC) override;
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int C, int OC) override;
  void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C,
                             int OC) override;
  void matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp,
                              int N, int C, int OC) override;

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C) override {
    timed("layernorm_forward",
          [&] { inner_.layernorm_forward(out, mean, rstd, inp, weight, bias, N, C); });
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    timed("layernorm_backward", [&] {
      inner_.layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
    });
  }
  void gelu_forward(float* out, const float* inp, long N) override {
    timed("gelu_forward", [&] { inner_.gelu_forward(out, inp, N); });
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, long N) override {
    timed("gelu_backward", [&] { inner_.gelu_backward(dinp, inp, dout, N); });
  }
  void attention_forward(float* out, float* att, const float* qkv, const uint8_t* key_mask,
                         bool causal, int B, int T, int C, int NH) override {
    timed("attention_forward",
          [&] { inner_.attention_forward(out, att, qkv, key_mask, causal, B, T, C, NH); });
  }
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                          const float* att, int B, int T, int C, int NH, bool causal) override {
    timed("attention_backward",
          [&] { inner_.attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH, causal); });
  }
  int crossentropy_forward(float* losses, float* probs, const float* logits, const int32_t* targets,
                           int N, int V) override {
    return timed("crossentropy_forward",
                 [&] { return inner_.crossentropy_forward(losses, probs, logits, targets, N, V); });
  }
  int crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                    const int32_t* targets, float dloss, int N, int V) override {
    return timed("crossentropy_forward_backward", [&] {
      return inner_.crossentropy_forward_backward(losses, dlogits, logits, targets, dloss, N, V);
    });
  }
  double sum_losses(const float* losses, int N) override {
    return timed("sum_losses", [&] { return inner_.sum_losses(losses, N); });
  }
  void encoder_forward(float* out, const int32_t* tokens, const int32_t* segments, const float* wte,
                       const float* wpe, const float* wse, int B, int T, int C) override {
    timed("encoder_forward",
          [&] { inner_.encoder_forward(out, tokens, segments, wte, wpe, wse, B, T, C); });
  }
  void encoder_backward(float* dwte, float* dwpe, float* dwse, const float* dout,
                        const int32_t* tokens, const int32_t* segments, int B, int T,
                        int C) override {
    timed("encoder_backward",
          [&] { inner_.encoder_backward(dwte, dwpe, dwse, dout, tokens, segments, B, T, C); });
  }
  void residual_forward(float* out, const float* a, const float* b, long N) override {
    timed("residual_forward", [&] { inner_.residual_forward(out, a, b, N); });
  }
  void residual_backward(float* da, float* db, const float* dout, long N) override {
    timed("residual_backward", [&] { inner_.residual_backward(da, db, dout, N); });
  }
  void accumulate(float* dst, const float* src, long N) override {
    timed("accumulate", [&] { inner_.accumulate(dst, src, N); });
  }
  void fill_zero(float* dst, long N) override {
    timed("fill_zero", [&] { inner_.fill_zero(dst, N); });
  }
  void scale_inplace(float* dst, float s, long N) override {
    timed("scale_inplace", [&] { inner_.scale_inplace(dst, s, N); });
  }
  void gather_rows(float* out, const float* x, const int32_t* rows, int n, int C) override {
    timed("gather_rows", [&] { inner_.gather_rows(out, x, rows, n, C); });
  }
  void scatter_rows(float* out, const float* x, const int32_t* rows, int n, int C) override {
    timed("scatter_rows", [&] { inner_.scatter_rows(out, x, rows, n, C); });
  }
  void adamw_update(float* params, const float* grads, float* m, float* v, size_t n,
                    const AdamWParams& p, long t, float grad_scale,
                    const DelayCorrection& correction) override {
    timed("adamw_update",
          [&] { inner_.adamw_update(params, grads, m, v, n, p, t, grad_scale, correction); });
  }
  void xpipe_predict(float* out, const float* w, const float* m, const float* v, size_t n,
                     const WeightPrediction& p) override {
    timed("xpipe_predict", [&] { inner_.xpipe_predict(out, w, m, v, n, p); });
  }
  void sgd_update(float* params, const float* grads, float* momentum_buf, size_t n,
                  const SGDParams& p, float grad_scale,
                  const DelayCorrection& correction) override {
    timed("sgd_update",
          [&] { inner_.sgd_update(params, grads, momentum_buf, n, p, grad_scale, correction); });
  }
  double grad_sumsq(const float* grads, size_t n) override {
    return timed("grad_sumsq", [&] { return inner_.grad_sumsq(grads, n); });
  }

 private:
  enum class Kind : uint8_t { forward, backward, input, weight };
  struct Call {
    Kind kind;
    float *out, *dweight, *dbias;
    const float *inp, *weight, *bias, *dout;
    int N, C, OC;
  };
  // f() timed into profile_ under `op` while profiling
  template <class F>
  auto timed(const char* op, F&& f) -> decltype(f()) {
    if (!profiling_) return f();
    inner_.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    struct Stop {  // adds the time also when f() returns a value
      RecordingBackend& self;
      const char* op;
      std::chrono::steady_clock::time_point t0;
      ~Stop() {
        self.inner_.synchronize();
        self.add_time(
            op, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count());
      }
    } stop{*this, op, t0};
    return f();
  }
  void add_time(const char* op, double ms);

  ComputeBackend& inner_;
  bool recording_ = false;
  bool profiling_ = false;
  std::vector<Call> calls_;
  std::vector<OpTime> profile_;
};

}  // namespace actorpipe::bench
