// Transformer layers: the concrete GPT and BERT layers (embeddings, pre-LN block, LM and MLM
// heads) behind the Layer interface. Private to the engine; Model::build is the factory.
// Shapes: B sequences, T tokens, N = B·T rows, C width, NH heads, V vocabulary, maxT context,
// S segment types.
#include "engine/model/internal/transformer_layers.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/attention.hpp"
#include "kernels/check.hpp"
#include "kernels/compute_backend.hpp"
#include "kernels/crossentropy.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/encoder.hpp"
#include "kernels/gelu.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/matmul.hpp"

namespace actorpipe::internal {
namespace {

constexpr float kInitStd = 0.02f;

ParamSlot weight(std::string name, std::vector<int64_t> shape, float std_dev = kInitStd) {
  ParamSlot s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.init = InitKind::normal;
  s.init_std = std_dev;
  s.decay = true;
  return s;
}
/// A linear layer's weight: read only as the operand of its products (ParamSlot::product_operand).
ParamSlot linear(std::string name, std::vector<int64_t> shape, float std_dev = kInitStd) {
  ParamSlot s = weight(std::move(name), std::move(shape), std_dev);
  s.product_operand = true;
  return s;
}
ParamSlot bias(std::string name, int64_t n) {
  ParamSlot s;
  s.name = std::move(name);
  s.shape = {n};
  s.init = InitKind::zeros;
  return s;
}
ParamSlot norm_weight(std::string name, int64_t n) {
  ParamSlot s = bias(std::move(name), n);
  s.init = InitKind::ones;
  return s;
}
/// The head's decoder weight (V,C): read only as the operand of the logits' product and of the
/// input gradient's (ParamSlot::product_operand). When tied, Model::init_layer starts it as the
/// embedding's wte (the declared tie), whatever its own init says; a tied slot is never kept in
/// a bf16 stash (Model::bf16_stash_floats).
ParamSlot decoder_weight(std::string name, const ModelOptions& o) {
  return linear(std::move(name), {o.vocab_size, o.width});
}

/// Sequential offsets of the regions of a `saved` buffer.
class Layout {
 public:
  size_t add(size_t n) {
    size_t at = size_;
    size_ += n;
    return at;
  }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

// Every op below runs on the Context's backend (kernels/compute_backend.hpp): the CPU kernels, or a
// device's, with every float buffer in that backend's memory. In bf16 the backend's products round
// their operands; the fused bf16 paths (bf16 activations, GELU's backward writing the products'
// operand, deferred bf16 gradients) are CPU kernels, taken on the host only: elsewhere the f32
// paths compute the same values.

// n floats of the backend's scratch, zeroed.
float* zeros(Context& ctx, size_t n) {
  float* p = ctx.backend().scratch(n);
  ctx.backend().fill_zero(p, static_cast<long>(n));
  return p;
}

// `later` where the layer may defer weight gradients into it: it keeps host copies, so only on
// the host backend (elsewhere the backward runs in one pass, which the Layer contract allows).
DeferredGrads* deferral(const Context& ctx, DeferredGrads* later) {
  return ctx.host_backend() ? later : nullptr;
}

// The deferred weight half reads an output gradient in f32 (fp32), or its bf16 rounding, which
// the input half makes and keeps in later's storage (bf16: linear_backward).
bool defers_f32(const Context& ctx, const DeferredGrads* later) {
  return later != nullptr && ctx.precision() != Precision::bf16;
}

// n floats of an output gradient a linear backward reads: in later's storage when its deferred
// weight half reads them in f32, in the arena otherwise. Uninitialised.
float* kept(Context& ctx, DeferredGrads* later, size_t n) {
  return defers_f32(ctx, later) ? later->hold(n) : ctx.backend().scratch(n);
}

// kept(), zeroed.
float* kept_zeros(Context& ctx, DeferredGrads* later, size_t n) {
  float* p = kept(ctx, later, n);
  ctx.backend().fill_zero(p, static_cast<long>(n));
  return p;
}

// `dout` itself, or a copy that lives until later runs when the caller will overwrite dout and
// the deferred weight half reads it in f32.
const float* keep(const Context& ctx, DeferredGrads* later, const float* dout, size_t n) {
  return defers_f32(ctx, later) ? later->copy(dout, n) : dout;
}

// In bf16, the input half of a deferred linear backward: dout rounded into later's storage once
// (the bias gradient summed in that pass), the input product now, the weight product recorded
// on the rounding. The bits of matmul_backward.
template <class Input>
void deferred_bf16(Context& ctx, DeferredGrads& later, float* dinp, float* dweight, float* dbias,
                   const float* dout, const Input* inp, const float* weight, int N, int C, int OC) {
  bf16* g = later.hold_bf16(static_cast<size_t>(N) * static_cast<size_t>(OC));
  matmul_backward_input(ctx, dinp, dbias, g, dout, weight, N, C, OC);
  later.add_linear(dweight, g, inp, N, C, OC);
}

// matmul_backward, or its input half now and its weight half recorded into `later` (dout and
// inp must live until later runs: see kept() and keep()).
void linear_backward(Context& ctx, DeferredGrads* later, float* dinp, float* dweight, float* dbias,
                     const float* dout, const float* inp, const float* weight, int N, int C,
                     int OC) {
  if (later == nullptr) {
    ctx.backend().matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
    return;
  }
  if (ctx.precision() == Precision::bf16) {
    deferred_bf16(ctx, *later, dinp, dweight, dbias, dout, inp, weight, N, C, OC);
    return;
  }
  if (dinp != nullptr) ctx.backend().matmul_backward_input(dinp, dout, weight, N, C, OC);
  later->add_linear(dweight, dbias, dout, inp, N, C, OC);
}

// An activation that only products read, as a layer saved it: in f32, or (on a Context with
// bf16_activations()) as its bf16 rounding, in half the floats: the operand the bf16 products
// would round it to, so either gives the same bits.
struct ProductInput {
  const float* f32 = nullptr;
  const bf16* b16 = nullptr;
};

// Floats of a saved region holding n values that only products read.
size_t product_floats(size_t n, bool b16) {
  return b16 ? (n + 1) / 2 : n;
}

// The saved region `region` of n values written (at `written`: the region itself, or scratch
// when the Context keeps bf16 activations, rounded into the region here) as the products' input.
ProductInput keep_for_products(Context& ctx, const float* written, float* region, size_t n) {
  if (!ctx.bf16_activations()) return {written, nullptr};
  bf16* kept16 = reinterpret_cast<bf16*>(region);
  convert_to_bf16(ctx, written, kept16, static_cast<int64_t>(n));
  return {nullptr, kept16};
}

// layernorm_forward into the saved region `region`, as the products' input (rounded as it is
// written when the Context keeps bf16 activations).
ProductInput layernorm_for_products(Context& ctx, float* region, float* mean, float* rstd,
                                    const float* in, const float* w, const float* b, int N, int C) {
  if (!ctx.bf16_activations()) {
    ctx.backend().layernorm_forward(region, mean, rstd, in, w, b, N, C);
    return {region, nullptr};
  }
  bf16* kept16 = reinterpret_cast<bf16*>(region);
  layernorm_forward(ctx, kept16, mean, rstd, in, w, b, N, C);
  return {nullptr, kept16};
}

// gelu_forward of n values into the saved region `region`, likewise.
ProductInput gelu_for_products(Context& ctx, float* region, const float* in, size_t n) {
  if (!ctx.bf16_activations()) {
    ctx.backend().gelu_forward(region, in, static_cast<long>(n));
    return {region, nullptr};
  }
  bf16* kept16 = reinterpret_cast<bf16*>(region);
  gelu_forward(ctx, kept16, in, static_cast<long>(n));
  return {nullptr, kept16};
}

// A saved region keep_for_products filled, as the backward reads it.
ProductInput saved_input(const Context& ctx, const float* region) {
  if (!ctx.bf16_activations()) return {region, nullptr};
  return {nullptr, reinterpret_cast<const bf16*>(region)};
}

void linear_forward(Context& ctx, float* out, ProductInput x, const float* weight,
                    const float* bias, int N, int C, int OC) {
  if (x.b16 != nullptr)
    matmul_forward(ctx, out, x.b16, weight, bias, N, C, OC);
  else
    ctx.backend().matmul_forward(out, x.f32, weight, bias, N, C, OC);
}

void linear_backward(Context& ctx, DeferredGrads* later, float* dinp, float* dweight, float* dbias,
                     const float* dout, ProductInput inp, const float* weight, int N, int C,
                     int OC) {
  if (inp.b16 == nullptr) {
    linear_backward(ctx, later, dinp, dweight, dbias, dout, inp.f32, weight, N, C, OC);
  } else if (later == nullptr) {
    matmul_backward(ctx, dinp, dweight, dbias, dout, inp.b16, weight, N, C, OC);
  } else if (ctx.precision() == Precision::bf16) {
    deferred_bf16(ctx, *later, dinp, dweight, dbias, dout, inp.b16, weight, N, C, OC);
  } else {
    if (dinp != nullptr) matmul_backward_input(ctx, dinp, dout, weight, N, C, OC);
    later->add_linear(dweight, dbias, dout, inp.b16, N, C, OC);
  }
}

// linear_backward's bf16 products on an output gradient the caller rounded already (and whose
// bias gradient it took in that pass): both now, or the input product now and the weight
// product recorded into `later` (dout must live until later runs).
void linear_products_bf16(Context& ctx, DeferredGrads* later, float* dinp, float* dweight,
                          const bf16* dout, ProductInput inp, const float* weight, int N, int C,
                          int OC) {
  if (later != nullptr) {
    matmul_backward_products(ctx, dinp, nullptr, dout, inp.f32, weight, N, C, OC);
    if (inp.b16 != nullptr)
      later->add_linear(dweight, dout, inp.b16, N, C, OC);
    else
      later->add_linear(dweight, dout, inp.f32, N, C, OC);
  } else if (inp.b16 != nullptr) {
    matmul_backward_products(ctx, dinp, dweight, dout, inp.b16, weight, N, C, OC);
  } else {
    matmul_backward_products(ctx, dinp, dweight, dout, inp.f32, weight, N, C, OC);
  }
}

void check_ids(const std::vector<int32_t>& ids, size_t n, int32_t limit, bool allow_ignore,
               const char* what) {
  AP_CHECK(ids.size() == n, "microbatch {} has {} entries, expected B*T = {}", what, ids.size(), n);
  for (size_t i = 0; i < n; ++i) {
    const int32_t v = ids[i];
    AP_CHECK((v >= 0 && v < limit) || (allow_ignore && v == kIgnoreIndex),
             "microbatch {}[{}] = {} is outside [0, {})", what, i, v, limit);
  }
}

/// A layer whose slots are addressed by position (the order they were declared in).
class SlotLayer : public Layer {
 protected:
  SlotLayer(LayerRole role, const char* type, int index, std::vector<ParamSlot> slots,
            const ModelOptions& o)
      : Layer(role, type, index, std::move(slots)),
        C_(o.width),
        V_(o.vocab_size),
        maxT_(o.context) {}
  const float* p(const float* params, int slot) const {
    return params + slots()[static_cast<size_t>(slot)].offset;
  }
  float* g(float* grads, int slot) const {
    return grads + slots()[static_cast<size_t>(slot)].offset;
  }
  void check_shape(const Microbatch& mb) const {
    AP_CHECK(mb.B > 0 && mb.T > 0 && mb.T <= maxT_, "microbatch B = {}, T = {} (context {})", mb.B,
             mb.T, maxT_);
  }
  int C_;
  int V_;
  int maxT_;
};

// ---------------------------------------------------------------------------------------
// Embeddings

class GptEmbedding final : public SlotLayer {
  enum { WTE, WPE };

 public:
  GptEmbedding(const ModelOptions& o, int index)
      : SlotLayer(LayerRole::input, "gpt_embedding", index,
                  {weight("wte", {o.vocab_size, o.width}), weight("wpe", {o.context, o.width})},
                  o) {}
  size_t saved_floats(int, int) const override { return 0; }

  LossStats forward(Context& ctx, const float* params, const Microbatch& mb, const float*,
                    float* out, float*) const override {
    check_shape(mb);
    check_ids(mb.tokens, static_cast<size_t>(mb.B) * mb.T, V_, false, "tokens");
    ctx.backend().encoder_forward(out, mb.tokens.data(), nullptr, p(params, WTE), p(params, WPE),
                                  nullptr, mb.B, mb.T, C_);
    return {};
  }

  // The first layer: nothing waits for a din, so nothing is deferred.
  void backward(Context& ctx, const float*, float* grads, const Microbatch& mb, const float*,
                const float*, const float* dout, float*, float, DeferredGrads*) const override {
    check_shape(mb);
    ctx.backend().encoder_backward(g(grads, WTE), g(grads, WPE), nullptr, dout, mb.tokens.data(),
                                   nullptr, mb.B, mb.T, C_);
  }
};

class BertEmbedding final : public SlotLayer {
  enum { WTE, WPE, WSE, LNW, LNB };
  struct Saved {
    size_t enc, mean, rstd, total;
  };
  static Saved layout(int B, int T, int C) {
    const size_t N = static_cast<size_t>(B) * T;
    Layout l;
    Saved s{};
    s.enc = l.add(N * C);  // (N,C) embedding sum before the layernorm
    s.mean = l.add(N);
    s.rstd = l.add(N);
    s.total = l.size();
    return s;
  }

 public:
  BertEmbedding(const ModelOptions& o, int index)
      : SlotLayer(LayerRole::input, "bert_embedding", index,
                  {weight("wte", {o.vocab_size, o.width}), weight("wpe", {o.context, o.width}),
                   weight("wse", {o.segments, o.width}), norm_weight("ln.weight", o.width),
                   bias("ln.bias", o.width)},
                  o),
        S_(o.segments) {}
  size_t saved_floats(int B, int T) const override { return layout(B, T, C_).total; }

  LossStats forward(Context& ctx, const float* params, const Microbatch& mb, const float*,
                    float* out, float* saved) const override {
    check_shape(mb);
    const size_t N = static_cast<size_t>(mb.B) * mb.T;
    check_ids(mb.tokens, N, V_, false, "tokens");
    check_ids(mb.segments, N, S_, false, "segments");
    const Saved s = layout(mb.B, mb.T, C_);
    ctx.backend().encoder_forward(saved + s.enc, mb.tokens.data(), mb.segments.data(),
                                  p(params, WTE), p(params, WPE), p(params, WSE), mb.B, mb.T, C_);
    ctx.backend().layernorm_forward(out, saved + s.mean, saved + s.rstd, saved + s.enc,
                                    p(params, LNW), p(params, LNB), static_cast<int>(N), C_);
    return {};
  }

  // The first layer: nothing waits for a din, so nothing is deferred.
  void backward(Context& ctx, const float* params, float* grads, const Microbatch& mb, const float*,
                const float* saved, const float* dout, float*, float,
                DeferredGrads*) const override {
    check_shape(mb);
    const size_t N = static_cast<size_t>(mb.B) * mb.T;
    const Saved s = layout(mb.B, mb.T, C_);
    float* denc = zeros(ctx, N * C_);
    ctx.backend().layernorm_backward(denc, g(grads, LNW), g(grads, LNB), dout, saved + s.enc,
                                     p(params, LNW), saved + s.mean, saved + s.rstd,
                                     static_cast<int>(N), C_);
    ctx.backend().encoder_backward(g(grads, WTE), g(grads, WPE), g(grads, WSE), denc,
                                   mb.tokens.data(), mb.segments.data(), mb.B, mb.T, C_);
  }

 private:
  int S_;
};

// ---------------------------------------------------------------------------------------
// Transformer block (pre-LN)

class Block final : public SlotLayer {
  enum { LN1W, LN1B, QKVW, QKVB, PROJW, PROJB, LN2W, LN2B, FCW, FCB, FCPW, FCPB };
  struct Saved {
    size_t ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu,
        total;
  };
  // b16: the regions only products read (ln1, qkv, atty, ln2, fch_gelu) hold bf16 values
  Saved layout(int B, int T, bool b16) const {
    const size_t N = static_cast<size_t>(B) * T;
    const size_t C = static_cast<size_t>(C_);
    Layout l;
    Saved s{};
    s.ln1 = l.add(product_floats(N * C, b16));  // (N,C)
    s.ln1_mean = l.add(N);
    s.ln1_rstd = l.add(N);
    s.qkv = l.add(product_floats(N * 3 * C, b16));        // (N,3C)
    s.att = l.add(static_cast<size_t>(B) * NH_ * T * T);  // (B,NH,T,T)
    s.atty = l.add(product_floats(N * C, b16));           // (N,C) attention output
    s.res2 = l.add(N * C);                                // (N,C) x + attn
    s.ln2 = l.add(product_floats(N * C, b16));            // (N,C)
    s.ln2_mean = l.add(N);
    s.ln2_rstd = l.add(N);
    s.fch = l.add(N * 4 * C);                            // (N,4C)
    s.fch_gelu = l.add(product_floats(N * 4 * C, b16));  // (N,4C)
    s.total = l.size();
    return s;
  }
  static std::vector<ParamSlot> make_slots(const ModelOptions& o) {
    const int64_t C = o.width;
    // GPT-2: residual projections scaled by 1/sqrt(2L).
    const float res_std = kInitStd / std::sqrt(2.0f * static_cast<float>(o.depth));
    return {norm_weight("ln1.weight", C),
            bias("ln1.bias", C),
            linear("attn.qkv.weight", {3 * C, C}),
            bias("attn.qkv.bias", 3 * C),
            linear("attn.proj.weight", {C, C}, res_std),
            bias("attn.proj.bias", C),
            norm_weight("ln2.weight", C),
            bias("ln2.bias", C),
            linear("mlp.fc.weight", {4 * C, C}),
            bias("mlp.fc.bias", 4 * C),
            linear("mlp.proj.weight", {C, 4 * C}, res_std),
            bias("mlp.proj.bias", C)};
  }

 public:
  Block(const ModelOptions& o, int index, bool causal)
      : SlotLayer(LayerRole::hidden, causal ? "gpt_block" : "bert_block", index, make_slots(o), o),
        NH_(o.heads),
        causal_(causal) {}
  size_t saved_floats(int B, int T) const override { return layout(B, T, false).total; }
  size_t saved_floats_bf16(int B, int T) const override { return layout(B, T, true).total; }

  LossStats forward(Context& ctx, const float* params, const Microbatch& mb, const float* in,
                    float* out, float* saved) const override {
    check_shape(mb);
    const int B = mb.B, T = mb.T, C = C_;
    const int N = B * T;
    const size_t NC = static_cast<size_t>(N) * C;
    const bool b16 = ctx.bf16_activations();
    const Saved s = layout(B, T, b16);
    float* S = saved;
    // with bf16 activations, what only products read is rounded into its saved region as it is
    // written (the attention output through scratch)
    const ProductInput ln1 = layernorm_for_products(ctx, S + s.ln1, S + s.ln1_mean, S + s.ln1_rstd,
                                                    in, p(params, LN1W), p(params, LN1B), N, C);
    float* atty_out = b16 ? ctx.arena().alloc_f32(NC) : S + s.atty;
    if (b16) {
      // q, k and v are read by products only: rounded once into the saved region
      float* qkv = ctx.arena().alloc_f32(3 * NC);
      linear_forward(ctx, qkv, ln1, p(params, QKVW), p(params, QKVB), N, C, 3 * C);
      const ProductInput qkv16 = keep_for_products(ctx, qkv, S + s.qkv, 3 * NC);
      attention_forward(ctx, atty_out, S + s.att, qkv16.b16, key_mask(mb), causal_, B, T, C, NH_);
    } else {
      linear_forward(ctx, S + s.qkv, ln1, p(params, QKVW), p(params, QKVB), N, C, 3 * C);
      ctx.backend().attention_forward(atty_out, S + s.att, S + s.qkv, key_mask(mb), causal_, B, T,
                                      C, NH_);
    }
    const ProductInput atty = keep_for_products(ctx, atty_out, S + s.atty, NC);
    linear_forward(ctx, out, atty, p(params, PROJW), p(params, PROJB), N, C, C);
    ctx.backend().residual_forward(S + s.res2, in, out, static_cast<long>(NC));
    const ProductInput ln2 =
        layernorm_for_products(ctx, S + s.ln2, S + s.ln2_mean, S + s.ln2_rstd, S + s.res2,
                               p(params, LN2W), p(params, LN2B), N, C);
    linear_forward(ctx, S + s.fch, ln2, p(params, FCW), p(params, FCB), N, C, 4 * C);
    const ProductInput fch_gelu = gelu_for_products(ctx, S + s.fch_gelu, S + s.fch, 4 * NC);
    linear_forward(ctx, out, fch_gelu, p(params, FCPW), p(params, FCPB), N, 4 * C, C);
    ctx.backend().residual_forward(out, out, S + s.res2, static_cast<long>(NC));
    return {};
  }

  void backward(Context& ctx, const float* params, float* grads, const Microbatch& mb,
                const float* in, const float* saved, const float* dout, float* din, float,
                DeferredGrads* later) const override {
    check_shape(mb);
    later = deferral(ctx, later);
    const int B = mb.B, T = mb.T, C = C_;
    const int N = B * T;
    const size_t NC = static_cast<size_t>(N) * C;
    const Saved s = layout(B, T, ctx.bf16_activations());
    const float* S = saved;
    // din accumulates d(res2) first (residual + ln2 path), then d(in) (+ ln1 path).
    ctx.backend().copy(din, dout, NC);
    float* dfch_gelu = zeros(ctx, 4 * NC);
    linear_backward(ctx, later, dfch_gelu, g(grads, FCPW), g(grads, FCPB),
                    keep(ctx, later, dout, NC), saved_input(ctx, S + s.fch_gelu), p(params, FCPW),
                    N, 4 * C, C);
    float* dln = zeros(ctx, NC);
    if (ctx.precision() == Precision::bf16 && ctx.host_backend()) {
      // GELU's backward makes the fc products' bf16 operand and the fc bias gradient in one
      // pass (the bits of the f32 d(fch) through linear_backward); a deferred weight half
      // keeps that operand
      bf16* dfch16 = later != nullptr ? later->hold_bf16(4 * NC)
                                      : alloc_bf16(ctx, static_cast<int64_t>(4 * NC));
      gelu_backward(ctx, dfch16, g(grads, FCB), S + s.fch, dfch_gelu, N, 4 * C);
      linear_products_bf16(ctx, later, dln, g(grads, FCW), dfch16, saved_input(ctx, S + s.ln2),
                           p(params, FCW), N, C, 4 * C);
    } else {
      float* dfch = kept_zeros(ctx, later, 4 * NC);
      ctx.backend().gelu_backward(dfch, S + s.fch, dfch_gelu, static_cast<long>(4 * NC));
      linear_backward(ctx, later, dln, g(grads, FCW), g(grads, FCB), dfch,
                      saved_input(ctx, S + s.ln2), p(params, FCW), N, C, 4 * C);
    }
    ctx.backend().layernorm_backward(din, g(grads, LN2W), g(grads, LN2B), dln, S + s.res2,
                                     p(params, LN2W), S + s.ln2_mean, S + s.ln2_rstd, N, C);
    float* datty = zeros(ctx, NC);
    // din goes on accumulating: the projection's weight gradient reads its present value
    linear_backward(ctx, later, datty, g(grads, PROJW), g(grads, PROJB), keep(ctx, later, din, NC),
                    saved_input(ctx, S + s.atty), p(params, PROJW), N, C, C);
    float* dqkv = kept_zeros(ctx, later, 3 * NC);
    float* scratch = ctx.backend().scratch(static_cast<size_t>(B) * NH_ * T * T);
    const ProductInput qkv = saved_input(ctx, S + s.qkv);
    if (qkv.b16 != nullptr) {
      attention_backward(ctx, dqkv, scratch, datty, qkv.b16, S + s.att, B, T, C, NH_, causal_);
    } else {
      ctx.backend().attention_backward(dqkv, scratch, datty, qkv.f32, S + s.att, B, T, C, NH_,
                                       causal_);
    }
    ctx.backend().fill_zero(dln, static_cast<long>(NC));
    linear_backward(ctx, later, dln, g(grads, QKVW), g(grads, QKVB), dqkv,
                    saved_input(ctx, S + s.ln1), p(params, QKVW), N, C, 3 * C);
    ctx.backend().layernorm_backward(din, g(grads, LN1W), g(grads, LN1B), dln, in, p(params, LN1W),
                                     S + s.ln1_mean, S + s.ln1_rstd, N, C);
  }

 private:
  const uint8_t* key_mask(const Microbatch& mb) const {
    if (causal_ || mb.key_mask.empty()) return nullptr;
    AP_CHECK(mb.key_mask.size() == static_cast<size_t>(mb.B) * mb.T,
             "microbatch key_mask has {} entries, expected B*T = {}", mb.key_mask.size(),
             static_cast<size_t>(mb.B) * mb.T);
    return mb.key_mask.data();
  }
  int NH_;
  bool causal_;
};

// ---------------------------------------------------------------------------------------
// Heads: the logits (N,V) stay in `saved`; the backward recomputes the softmax from them.

/// Cross-entropy forward on saved logits (N rows, their targets); returns the loss.
LossStats loss_forward(Context& ctx, const float* logits, const int32_t* targets, int N, int V) {
  ComputeBackend& be = ctx.backend();
  float* losses = be.scratch(static_cast<size_t>(N));
  if (ctx.host_backend()) {  // the losses alone: no probabilities written (the same bits)
    const int count = crossentropy_losses(ctx, losses, logits, targets, N, V);
    return {be.sum_losses(losses, N), count};
  }
  float* probs = be.scratch(static_cast<size_t>(N) * V);
  const int count = be.crossentropy_forward(losses, probs, logits, targets, N, V);
  return {be.sum_losses(losses, N), count};
}

/// dlogits (N,V) for dloss·Σ losses, in kept() storage (the decoder's weight gradient reads it).
const float* loss_backward(Context& ctx, DeferredGrads* later, const float* logits,
                           const int32_t* targets, int N, int V, float dloss) {
  float* losses = ctx.backend().scratch(static_cast<size_t>(N));
  float* dlogits = kept(ctx, later, static_cast<size_t>(N) * V);
  ctx.backend().crossentropy_forward_backward(losses, dlogits, logits, targets, dloss, N, V);
  return dlogits;
}

/// The rows of a microbatch whose targets count, in order, and their targets: n of them, in
/// the Context's host arena (index arrays are host memory for every backend; no allocation in
/// the steady state).
struct CountedRows {
  int32_t* rows = nullptr;
  int32_t* targets = nullptr;
  int n = 0;
};
CountedRows counted_rows(Context& ctx, const Microbatch& mb) {
  const size_t N = mb.targets.size();
  CountedRows c;
  c.rows = reinterpret_cast<int32_t*>(ctx.arena().alloc_f32(N));
  c.targets = reinterpret_cast<int32_t*>(ctx.arena().alloc_f32(N));
  for (size_t i = 0; i < N; ++i) {
    if (mb.targets[i] == kIgnoreIndex) continue;
    c.rows[c.n] = static_cast<int32_t>(i);
    c.targets[c.n] = mb.targets[i];
    ++c.n;
  }
  return c;
}

class GptHead final : public SlotLayer {
  enum { LNFW, LNFB, LMW };
  struct Saved {
    size_t lnf, mean, rstd, logits, stats, total;
  };
  Saved layout(int B, int T) const {
    const size_t N = static_cast<size_t>(B) * T;
    Layout l;
    Saved s{};
    s.lnf = l.add(N * C_);  // (N,C)
    s.mean = l.add(N);
    s.rstd = l.add(N);
    s.logits = l.add(N * V_);  // (N,V)
    s.stats = l.add(2 * N);    // each row's largest logit and exponentials' sum (host)
    s.total = l.size();
    return s;
  }

 public:
  GptHead(const ModelOptions& o, int index)
      : SlotLayer(LayerRole::loss, "gpt_head", index,
                  {norm_weight("ln_f.weight", o.width), bias("ln_f.bias", o.width),
                   decoder_weight("lm_head.weight", o)},
                  o) {}
  size_t saved_floats(int B, int T) const override { return layout(B, T).total; }
  const float* logits(const float* saved, int B, int T) const override {
    return saved + layout(B, T).logits;
  }

  LossStats forward(Context& ctx, const float* params, const Microbatch& mb, const float* in,
                    float*, float* saved) const override {
    check_shape(mb);
    const int N = mb.B * mb.T;
    const Saved s = layout(mb.B, mb.T);
    float* S = saved;
    ctx.backend().layernorm_forward(S + s.lnf, S + s.mean, S + s.rstd, in, p(params, LNFW),
                                    p(params, LNFB), N, C_);
    ctx.backend().matmul_forward(S + s.logits, S + s.lnf, p(params, LMW), nullptr, N, C_, V_);
    check_ids(mb.targets, static_cast<size_t>(N), V_, true, "targets");
    if (ctx.host_backend()) {  // the rows' statistics kept: the backward does not find them again
      float* losses = ctx.backend().scratch(static_cast<size_t>(N));
      const int count =
          crossentropy_losses(ctx, losses, S + s.stats, S + s.logits, mb.targets.data(), N, V_);
      return {ctx.backend().sum_losses(losses, N), count};
    }
    return loss_forward(ctx, S + s.logits, mb.targets.data(), N, V_);
  }

  void backward(Context& ctx, const float* params, float* grads, const Microbatch& mb,
                const float* in, const float* saved, const float*, float* din, float dloss,
                DeferredGrads* later) const override {
    check_shape(mb);
    later = deferral(ctx, later);
    const int N = mb.B * mb.T;
    const size_t NC = static_cast<size_t>(N) * C_;
    const Saved s = layout(mb.B, mb.T);
    const float* S = saved;
    float* dlnf = zeros(ctx, NC);
    const size_t NV = static_cast<size_t>(N) * V_;
    if (ctx.precision() == Precision::bf16 && ctx.host_backend()) {
      // the loss's backward writes the LM head products' bf16 operand itself (the bits of the
      // f32 dlogits through linear_backward, without them); a deferred weight half keeps it
      bf16* dlogits16 =
          later != nullptr ? later->hold_bf16(NV) : alloc_bf16(ctx, static_cast<int64_t>(NV));
      crossentropy_backward(ctx, dlogits16, S + s.stats, S + s.logits, mb.targets.data(), dloss, N,
                            V_);
      linear_products_bf16(ctx, later, dlnf, g(grads, LMW), dlogits16, ProductInput{S + s.lnf},
                           p(params, LMW), N, C_, V_);
    } else {
      const float* dlogits = nullptr;
      if (ctx.host_backend()) {
        float* d = kept(ctx, later, NV);
        crossentropy_backward(ctx, d, S + s.stats, S + s.logits, mb.targets.data(), dloss, N, V_);
        dlogits = d;
      } else {
        dlogits = loss_backward(ctx, later, S + s.logits, mb.targets.data(), N, V_, dloss);
      }
      linear_backward(ctx, later, dlnf, g(grads, LMW), nullptr, dlogits, S + s.lnf, p(params, LMW),
                      N, C_, V_);
    }
    ctx.backend().fill_zero(din, static_cast<long>(NC));
    ctx.backend().layernorm_backward(din, g(grads, LNFW), g(grads, LNFB), dlnf, in, p(params, LNFW),
                                     S + s.mean, S + s.rstd, N, C_);
  }
};

// The MLM head computes only the rows whose targets count (the masked positions, 15% by
// default): nothing else reaches the loss. Its saved buffers hold those n rows, in order; an
// input row that does not count gets a zero gradient.
class BertHead final : public SlotLayer {
  enum { LNFW, LNFB, DW, DB, LNW, LNB, DECW, DECB };
  struct Saved {
    size_t lnf, lnf_mean, lnf_rstd, h, hg, t, t_mean, t_rstd, logits, total;
  };
  // room for every row of the microbatch (n <= B·T)
  Saved layout(int B, int T) const {
    const size_t N = static_cast<size_t>(B) * T;
    const size_t NC = N * static_cast<size_t>(C_);
    Layout l;
    Saved s{};
    s.lnf = l.add(NC);  // (n,C) ln_f(x) of the counted rows
    s.lnf_mean = l.add(N);
    s.lnf_rstd = l.add(N);
    s.h = l.add(NC);   // (n,C) dense
    s.hg = l.add(NC);  // (n,C) gelu
    s.t = l.add(NC);   // (n,C) mlm.ln
    s.t_mean = l.add(N);
    s.t_rstd = l.add(N);
    s.logits = l.add(N * V_);  // (n,V)
    s.total = l.size();
    return s;
  }

 public:
  BertHead(const ModelOptions& o, int index)
      : SlotLayer(LayerRole::loss, "bert_head", index,
                  {norm_weight("ln_f.weight", o.width), bias("ln_f.bias", o.width),
                   linear("mlm.dense.weight", {o.width, o.width}), bias("mlm.dense.bias", o.width),
                   norm_weight("mlm.ln.weight", o.width), bias("mlm.ln.bias", o.width),
                   decoder_weight("mlm.decoder.weight", o), bias("mlm.decoder.bias", o.vocab_size)},
                  o) {}
  size_t saved_floats(int B, int T) const override { return layout(B, T).total; }
  const float* logits(const float* saved, int B, int T) const override {
    return saved + layout(B, T).logits;
  }
  std::vector<int> logit_rows(const Microbatch& mb) const override {
    std::vector<int> rows;
    for (size_t i = 0; i < mb.targets.size(); ++i)
      if (mb.targets[i] != kIgnoreIndex) rows.push_back(static_cast<int>(i));
    return rows;
  }

  LossStats forward(Context& ctx, const float* params, const Microbatch& mb, const float* in,
                    float*, float* saved) const override {
    check_shape(mb);
    check_ids(mb.targets, static_cast<size_t>(mb.B) * mb.T, V_, true, "targets");
    const Saved s = layout(mb.B, mb.T);
    float* S = saved;
    const CountedRows c = counted_rows(ctx, mb);
    const int n = c.n;
    if (n == 0) return {};
    ComputeBackend& be = ctx.backend();
    float* x = be.scratch(static_cast<size_t>(n) * C_);
    be.gather_rows(x, in, c.rows, n, C_);
    be.layernorm_forward(S + s.lnf, S + s.lnf_mean, S + s.lnf_rstd, x, p(params, LNFW),
                         p(params, LNFB), n, C_);
    be.matmul_forward(S + s.h, S + s.lnf, p(params, DW), p(params, DB), n, C_, C_);
    be.gelu_forward(S + s.hg, S + s.h, static_cast<long>(n) * C_);
    be.layernorm_forward(S + s.t, S + s.t_mean, S + s.t_rstd, S + s.hg, p(params, LNW),
                         p(params, LNB), n, C_);
    be.matmul_forward(S + s.logits, S + s.t, p(params, DECW), p(params, DECB), n, C_, V_);
    return loss_forward(ctx, S + s.logits, c.targets, n, V_);
  }

  void backward(Context& ctx, const float* params, float* grads, const Microbatch& mb,
                const float* in, const float* saved, const float*, float* din, float dloss,
                DeferredGrads* later) const override {
    check_shape(mb);
    later = deferral(ctx, later);
    ComputeBackend& be = ctx.backend();
    const int N = mb.B * mb.T;
    const Saved s = layout(mb.B, mb.T);
    const float* S = saved;
    be.fill_zero(din, static_cast<long>(N) * C_);
    const CountedRows c = counted_rows(ctx, mb);
    const int n = c.n;
    if (n == 0) return;
    const size_t nC = static_cast<size_t>(n) * C_;
    const float* dlogits = loss_backward(ctx, later, S + s.logits, c.targets, n, V_, dloss);
    float* dt = zeros(ctx, nC);
    linear_backward(ctx, later, dt, g(grads, DECW), g(grads, DECB), dlogits, S + s.t,
                    p(params, DECW), n, C_, V_);
    float* dhg = zeros(ctx, nC);
    be.layernorm_backward(dhg, g(grads, LNW), g(grads, LNB), dt, S + s.hg, p(params, LNW),
                          S + s.t_mean, S + s.t_rstd, n, C_);
    float* dh = kept_zeros(ctx, later, nC);
    be.gelu_backward(dh, S + s.h, dhg, static_cast<long>(nC));
    float* dlnf = dt;  // dt is dead: reuse it
    be.fill_zero(dlnf, static_cast<long>(nC));
    linear_backward(ctx, later, dlnf, g(grads, DW), g(grads, DB), dh, S + s.lnf, p(params, DW), n,
                    C_, C_);
    float* x = be.scratch(nC);
    be.gather_rows(x, in, c.rows, n, C_);
    float* dx = zeros(ctx, nC);
    be.layernorm_backward(dx, g(grads, LNFW), g(grads, LNFB), dlnf, x, p(params, LNFW),
                          S + s.lnf_mean, S + s.lnf_rstd, n, C_);
    be.scatter_rows(din, dx, c.rows, n, C_);
  }
};

}  // namespace

std::shared_ptr<const Layer> make_gpt_embedding(const ModelOptions& o, int index) {
  return std::make_shared<GptEmbedding>(o, index);
}
std::shared_ptr<const Layer> make_bert_embedding(const ModelOptions& o, int index) {
  return std::make_shared<BertEmbedding>(o, index);
}
std::shared_ptr<const Layer> make_block(const ModelOptions& o, int index, bool causal) {
  return std::make_shared<Block>(o, index, causal);
}
std::shared_ptr<const Layer> make_gpt_head(const ModelOptions& o, int index) {
  return std::make_shared<GptHead>(o, index);
}
std::shared_ptr<const Layer> make_bert_head(const ModelOptions& o, int index) {
  return std::make_shared<BertHead>(o, index);
}

}  // namespace actorpipe::internal
