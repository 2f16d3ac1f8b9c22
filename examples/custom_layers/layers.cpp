// custom_layers: the three layers of the example model. Each is a const forward/backward pair
// over the engine's buffers (docs/api.md, "Your own layers"); the GEMMs go through actorpipe's
// kernels, RMSNorm and SiLU are written out here. The linear maps' weight gradients go into the
// DeferredGrads when the engine passes one (a split backward); the engine would also accept a
// layer that ignored it.
#include "layers.hpp"

#include <actorpipe/kernels/crossentropy.hpp>
#include <actorpipe/kernels/matmul.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace ap = actorpipe;

namespace custom {
namespace {

constexpr float kEps = 1e-5f;

ap::ParamSlot matrix(std::string name, int64_t rows, int64_t cols, float std_dev) {
  ap::ParamSlot s;
  s.name = std::move(name);
  s.shape = {rows, cols};
  s.init = ap::InitKind::normal;
  s.init_std = std_dev;
  s.decay = true;
  return s;
}

ap::ParamSlot gain(std::string name, int64_t n) {
  ap::ParamSlot s;
  s.name = std::move(name);
  s.shape = {n};
  s.init = ap::InitKind::ones;
  return s;
}

size_t rows(const ap::Microbatch& mb) {
  return static_cast<size_t>(mb.B) * static_cast<size_t>(mb.T);
}

/// n = x · r · g with r = 1/sqrt(mean(x²) + eps), per row; r is kept for the backward.
void rmsnorm_forward(float* n, float* r, const float* x, const float* g, size_t N, int C) {
  for (size_t i = 0; i < N; ++i) {
    const float* xi = x + i * C;
    double ss = 0.0;
    for (int c = 0; c < C; ++c) ss += static_cast<double>(xi[c]) * xi[c];
    r[i] = static_cast<float>(1.0 / std::sqrt(ss / C + kEps));
    for (int c = 0; c < C; ++c) n[i * C + c] = xi[c] * r[i] * g[c];
  }
}

/// dx (overwritten) and dg (+=) from dn: dx = r·g·dn − x·r³·(1/C)·Σ_c dn·g·x.
void rmsnorm_backward(float* dx, float* dg, const float* dn, const float* x, const float* g,
                      const float* r, size_t N, int C) {
  for (size_t i = 0; i < N; ++i) {
    const float* xi = x + i * C;
    const float* dni = dn + i * C;
    double dot = 0.0;
    for (int c = 0; c < C; ++c) dot += static_cast<double>(dni[c]) * g[c] * xi[c];
    const float k = static_cast<float>(dot / C) * r[i] * r[i] * r[i];
    for (int c = 0; c < C; ++c) {
      dg[c] += dni[c] * xi[c] * r[i];
      dx[i * C + c] = r[i] * g[c] * dni[c] - xi[c] * k;
    }
  }
}

/// n floats of scratch that live until the weight gradients are computed: the DeferredGrads'
/// own storage in a split backward, the arena otherwise.
float* scratch(ap::Context& ctx, ap::DeferredGrads* later, size_t n) {
  return later != nullptr ? later->hold(n) : ctx.arena().alloc_f32(n);
}

/// dW (OC,C) += doutᵀ · inp now, or recorded for DeferredGrads::run.
void weight_grad(ap::Context& ctx, ap::DeferredGrads* later, float* dW, const float* dout,
                 const float* inp, int N, int C, int OC) {
  if (later != nullptr) {
    later->add_linear(dW, nullptr, dout, inp, N, C, OC);
  } else {
    ap::matmul_backward_weight(ctx, dW, nullptr, dout, inp, N, C, OC);
  }
}

class TokenEmbedding final : public ap::Layer {
 public:
  TokenEmbedding(const ap::ModelOptions& o, int index)
      : Layer(ap::LayerRole::input, "token_embedding", index,
              {matrix("tok.weight", o.vocab_size, o.width, 0.02f)}),
        C_(o.width) {}
  size_t saved_floats(int, int) const override { return 0; }

  ap::LossStats forward(ap::Context&, const float* params, const ap::Microbatch& mb, const float*,
                        float* out, float*) const override {
    for (size_t i = 0; i < rows(mb); ++i)
      std::memcpy(out + i * C_, params + static_cast<size_t>(mb.tokens[i]) * C_,
                  sizeof(float) * C_);
    return {};
  }
  void backward(ap::Context&, const float*, float* grads, const ap::Microbatch& mb, const float*,
                const float*, const float* dout, float*, float, ap::DeferredGrads*) const override {
    for (size_t i = 0; i < rows(mb); ++i) {  // in row order: the same bits every time
      float* g = grads + static_cast<size_t>(mb.tokens[i]) * C_;
      for (int c = 0; c < C_; ++c) g[c] += dout[i * C_ + c];
    }
  }

 private:
  int C_;
};

/// y = x + down(silu(gate(n)) ⊙ up(n)), n = rmsnorm(x).
class SwiGluBlock final : public ap::Layer {
  enum { NORM, GATE, UP, DOWN };
  struct Saved {
    size_t n, r, a, b, s, total;
  };
  Saved layout(const ap::Microbatch& mb) const {
    const size_t N = rows(mb), C = static_cast<size_t>(C_), H = static_cast<size_t>(H_);
    Saved s{};
    s.n = 0;
    s.r = s.n + N * C;
    s.a = s.r + N;
    s.b = s.a + N * H;
    s.s = s.b + N * H;
    s.total = s.s + N * H;
    return s;
  }

 public:
  SwiGluBlock(const ap::ModelOptions& o, int index)
      : Layer(ap::LayerRole::hidden, "swiglu_block", index,
              {gain("norm.weight", o.width),
               matrix("mlp.gate.weight", kExpand * o.width, o.width, 0.02f),
               matrix("mlp.up.weight", kExpand * o.width, o.width, 0.02f),
               matrix("mlp.down.weight", o.width, kExpand * o.width, 0.02f)}),
        C_(o.width),
        H_(kExpand * o.width) {}
  size_t saved_floats(int B, int T) const override {
    ap::Microbatch mb;
    mb.B = B;
    mb.T = T;
    return layout(mb).total;
  }

  ap::LossStats forward(ap::Context& ctx, const float* params, const ap::Microbatch& mb,
                        const float* in, float* out, float* saved) const override {
    const Saved s = layout(mb);
    const int N = static_cast<int>(rows(mb));
    float* S = saved;
    rmsnorm_forward(S + s.n, S + s.r, in, p(params, NORM), rows(mb), C_);
    ap::matmul_forward(ctx, S + s.a, S + s.n, p(params, GATE), nullptr, N, C_, H_);
    ap::matmul_forward(ctx, S + s.b, S + s.n, p(params, UP), nullptr, N, C_, H_);
    const size_t NH = rows(mb) * static_cast<size_t>(H_);
    for (size_t k = 0; k < NH; ++k) S[s.s + k] = silu(S[s.a + k]) * S[s.b + k];
    ap::matmul_forward(ctx, out, S + s.s, p(params, DOWN), nullptr, N, H_, C_);
    const size_t NC = rows(mb) * static_cast<size_t>(C_);
    for (size_t k = 0; k < NC; ++k) out[k] += in[k];
    return {};
  }

  void backward(ap::Context& ctx, const float* params, float* grads, const ap::Microbatch& mb,
                const float* in, const float* saved, const float* dout, float* din, float,
                ap::DeferredGrads* later) const override {
    const Saved s = layout(mb);
    const int N = static_cast<int>(rows(mb));
    const size_t NC = rows(mb) * static_cast<size_t>(C_), NH = rows(mb) * static_cast<size_t>(H_);
    const float* S = saved;
    // dout may be overwritten once this returns: a split backward keeps a copy
    const float* dy = later != nullptr ? later->copy(dout, NC) : dout;
    float* ds = ctx.arena().alloc_f32(NH);
    std::memset(ds, 0, sizeof(float) * NH);
    ap::matmul_backward_input(ctx, ds, dy, p(params, DOWN), N, H_, C_);
    weight_grad(ctx, later, g(grads, DOWN), dy, S + s.s, N, H_, C_);
    float* da = scratch(ctx, later, NH);
    float* db = scratch(ctx, later, NH);
    for (size_t k = 0; k < NH; ++k) {
      const float a = S[s.a + k];
      const float sig = 1.0f / (1.0f + std::exp(-a));
      db[k] = ds[k] * a * sig;
      da[k] = ds[k] * S[s.b + k] * sig * (1.0f + a * (1.0f - sig));
    }
    float* dn = ctx.arena().alloc_f32(NC);
    std::memset(dn, 0, sizeof(float) * NC);
    ap::matmul_backward_input(ctx, dn, da, p(params, GATE), N, C_, H_);
    ap::matmul_backward_input(ctx, dn, db, p(params, UP), N, C_, H_);
    weight_grad(ctx, later, g(grads, GATE), da, S + s.n, N, C_, H_);
    weight_grad(ctx, later, g(grads, UP), db, S + s.n, N, C_, H_);
    rmsnorm_backward(din, g(grads, NORM), dn, in, p(params, NORM), S + s.r, rows(mb), C_);
    for (size_t k = 0; k < NC; ++k) din[k] += dout[k];  // the residual
  }

 private:
  static float silu(float a) { return a / (1.0f + std::exp(-a)); }
  const float* p(const float* params, int slot) const {
    return params + slots()[static_cast<size_t>(slot)].offset;
  }
  float* g(float* grads, int slot) const {
    return grads + slots()[static_cast<size_t>(slot)].offset;
  }
  int C_;
  int H_;
};

/// logits = rmsnorm(x) · lm_head.weightᵀ, softmax cross-entropy against the targets.
class RmsHead final : public ap::Layer {
  enum { NORM, LM };
  struct Saved {
    size_t n, r, logits, total;
  };
  Saved layout(int B, int T) const {
    const size_t N = static_cast<size_t>(B) * static_cast<size_t>(T);
    Saved s{};
    s.n = 0;
    s.r = N * static_cast<size_t>(C_);
    s.logits = s.r + N;
    s.total = s.logits + N * static_cast<size_t>(V_);
    return s;
  }

 public:
  RmsHead(const ap::ModelOptions& o, int index)
      : Layer(
            ap::LayerRole::loss, "rms_head", index,
            {gain("norm.weight", o.width), matrix("lm_head.weight", o.vocab_size, o.width, 0.02f)}),
        C_(o.width),
        V_(o.vocab_size) {}
  size_t saved_floats(int B, int T) const override { return layout(B, T).total; }
  const float* logits(const float* saved, int B, int T) const override {
    return saved + layout(B, T).logits;
  }

  ap::LossStats forward(ap::Context& ctx, const float* params, const ap::Microbatch& mb,
                        const float* in, float*, float* saved) const override {
    const Saved s = layout(mb.B, mb.T);
    const int N = static_cast<int>(rows(mb));
    rmsnorm_forward(saved + s.n, saved + s.r, in, params + slots()[NORM].offset, rows(mb), C_);
    ap::matmul_forward(ctx, saved + s.logits, saved + s.n, params + slots()[LM].offset, nullptr, N,
                       C_, V_);
    float* losses = ctx.arena().alloc_f32(rows(mb));
    float* probs = ctx.arena().alloc_f32(rows(mb) * static_cast<size_t>(V_));
    const int count =
        ap::crossentropy_forward(ctx, losses, probs, saved + s.logits, mb.targets.data(), N, V_);
    return {ap::sum_losses(losses, N), count};
  }

  void backward(ap::Context& ctx, const float* params, float* grads, const ap::Microbatch& mb,
                const float* in, const float* saved, const float*, float* din, float dloss,
                ap::DeferredGrads* later) const override {
    const Saved s = layout(mb.B, mb.T);
    const int N = static_cast<int>(rows(mb));
    const size_t NC = rows(mb) * static_cast<size_t>(C_);
    float* losses = ctx.arena().alloc_f32(rows(mb));
    float* dlogits = scratch(ctx, later, rows(mb) * static_cast<size_t>(V_));
    ap::crossentropy_forward_backward(ctx, losses, dlogits, saved + s.logits, mb.targets.data(),
                                      dloss, N, V_);
    float* dn = ctx.arena().alloc_f32(NC);
    std::memset(dn, 0, sizeof(float) * NC);
    ap::matmul_backward_input(ctx, dn, dlogits, params + slots()[LM].offset, N, C_, V_);
    weight_grad(ctx, later, grads + slots()[LM].offset, dlogits, saved + s.n, N, C_, V_);
    rmsnorm_backward(din, grads + slots()[NORM].offset, dn, in, params + slots()[NORM].offset,
                     saved + s.r, rows(mb), C_);
  }

 private:
  int C_;
  int V_;
};

}  // namespace

ap::Expected<ap::Model> make_model(const ap::ModelOptions& shape) {
  std::vector<std::shared_ptr<const ap::Layer>> layers;
  layers.push_back(std::make_shared<TokenEmbedding>(shape, 0));
  for (int l = 1; l <= shape.depth; ++l) layers.push_back(std::make_shared<SwiGluBlock>(shape, l));
  const int head = shape.depth + 1;
  layers.push_back(std::make_shared<RmsHead>(shape, head));
  // the head's output matrix is the embedding: declared, and the engine does the rest
  return ap::Model::from_layers(shape, std::move(layers),
                                {{0, "tok.weight", head, "lm_head.weight"}});
}

}  // namespace custom
