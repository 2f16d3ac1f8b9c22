// Model tests: layer lists and slots, seeded partition-independent init, stateless layers,
// and gradients of whole tiny GPT and BERT models against a double-precision naive model.
#include "engine/model/model.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/execution/reference_trainer.hpp"
#include "engine/model/internal/transformer_layers.hpp"
#include "engine/rng.hpp"
#include "kernels/bf16_gemm.hpp"
#include "kernels/check.hpp"
#include "kernels/crossentropy.hpp"

using namespace actorpipe;

namespace {

ModelOptions tiny(Arch arch) {
  ModelOptions o;
  o.arch = arch;
  o.vocab_size = 20;
  o.context = 8;
  o.width = 8;
  o.depth = 2;
  o.heads = 2;
  o.segments = 2;
  o.tied = true;
  o.init_seed = 5;
  return o;
}

Model build(const ModelOptions& o) {
  auto m = Model::build(o);
  REQUIRE_MESSAGE(m.ok(), (m.ok() ? "" : m.error().message));
  return std::move(m).value();
}

/// A microbatch with deterministic pseudo-random content. BERT: segments, a padded tail in
/// sequence 1 and a few predicted (masked) positions; GPT: some ignored targets.
Microbatch make_mb(Arch arch, int B, int T, int V, uint64_t seed) {
  SplitMix64 r(seed);
  Microbatch mb;
  mb.B = B;
  mb.T = T;
  const size_t N = static_cast<size_t>(B) * T;
  for (size_t i = 0; i < N; ++i) mb.tokens.push_back(static_cast<int32_t>(r.next() % V));
  if (arch == Arch::gpt) {
    for (size_t i = 0; i < N; ++i) mb.targets.push_back(static_cast<int32_t>(r.next() % V));
    mb.targets[2] = kIgnoreIndex;
  } else {
    mb.targets.assign(N, kIgnoreIndex);
    mb.key_mask.assign(N, 1);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) {
        const size_t i = static_cast<size_t>(b) * T + t;
        mb.segments.push_back(t < T / 2 ? 0 : 1);
        if (b == 1 && t >= T - 2)
          mb.key_mask[i] = 0;  // padding
        else if (r.next() % 3 == 0)
          mb.targets[i] = static_cast<int32_t>(r.next() % V);
      }
    mb.targets[1] = 3;  // at least one predicted position
  }
  return mb;
}

// ---------------------------------------------------------------------------------------
// A naive double-precision model written from the definitions, reading the same slots.

using Vec = std::vector<double>;

struct Naive {
  const Model& model;
  std::vector<Vec> P;  // per-layer parameters in double

  const double* slot(int layer, const char* name) const {
    const ParamSlot* s = model.layer(layer).find_slot(name);
    AP_CHECK(s != nullptr, "no slot {}", name);
    return P[static_cast<size_t>(layer)].data() + s->offset;
  }

  static Vec layernorm(const Vec& x, const double* w, const double* b, size_t N, size_t C) {
    Vec y(x.size());
    for (size_t n = 0; n < N; ++n) {
      const double* r = &x[n * C];
      double mean = 0, var = 0;
      for (size_t c = 0; c < C; ++c) mean += r[c];
      mean /= C;
      for (size_t c = 0; c < C; ++c) var += (r[c] - mean) * (r[c] - mean);
      var /= C;
      const double rs = 1.0 / std::sqrt(var + 1e-5);
      for (size_t c = 0; c < C; ++c) y[n * C + c] = (r[c] - mean) * rs * w[c] + b[c];
    }
    return y;
  }
  static Vec linear(const Vec& x, const double* W, const double* b, size_t N, size_t C, size_t OC) {
    Vec y(N * OC);
    for (size_t n = 0; n < N; ++n)
      for (size_t o = 0; o < OC; ++o) {
        double s = b ? b[o] : 0.0;
        for (size_t c = 0; c < C; ++c) s += x[n * C + c] * W[o * C + c];
        y[n * OC + o] = s;
      }
    return y;
  }
  static Vec gelu(Vec x) {
    const double k = std::sqrt(2.0 / M_PI);
    for (double& v : x) v = 0.5 * v * (1.0 + std::tanh(k * (v + 0.044715 * v * v * v)));
    return x;
  }
  static Vec attention(const Vec& qkv, const uint8_t* mask, bool causal, size_t B, size_t T,
                       size_t C, size_t NH) {
    const size_t hs = C / NH;
    Vec out(B * T * C, 0.0);
    for (size_t b = 0; b < B; ++b)
      for (size_t h = 0; h < NH; ++h)
        for (size_t t = 0; t < T; ++t) {
          const double* q = &qkv[(b * T + t) * 3 * C + h * hs];
          Vec s(T, 0.0);
          std::vector<bool> ok(T, false);
          double mx = -INFINITY;
          for (size_t u = 0; u < T; ++u) {
            ok[u] = (!causal || u <= t) && (!mask || mask[b * T + u]);
            if (!ok[u]) continue;
            const double* k = &qkv[(b * T + u) * 3 * C + C + h * hs];
            double d = 0;
            for (size_t i = 0; i < hs; ++i) d += q[i] * k[i];
            s[u] = d / std::sqrt(static_cast<double>(hs));
            mx = std::max(mx, s[u]);
          }
          if (mx == -INFINITY) continue;
          double z = 0;
          for (size_t u = 0; u < T; ++u) z += ok[u] ? std::exp(s[u] - mx) : 0.0;
          for (size_t u = 0; u < T; ++u) {
            if (!ok[u]) continue;
            const double p = std::exp(s[u] - mx) / z;
            const double* v = &qkv[(b * T + u) * 3 * C + 2 * C + h * hs];
            for (size_t i = 0; i < hs; ++i) out[(b * T + t) * C + h * hs + i] += p * v[i];
          }
        }
    return out;
  }

  /// Logits (B,T,V) of the microbatch.
  Vec logits(const Microbatch& mb) const {
    const ModelOptions& o = model.options();
    const size_t B = mb.B, T = mb.T, C = o.width, V = o.vocab_size, N = B * T;
    const bool bert = o.arch == Arch::bert;
    const double* wte = slot(0, "wte");
    const double* wpe = slot(0, "wpe");
    Vec x(N * C);
    for (size_t n = 0; n < N; ++n)
      for (size_t c = 0; c < C; ++c) {
        x[n * C + c] = wte[mb.tokens[n] * C + c] + wpe[(n % T) * C + c];
        if (bert) x[n * C + c] += slot(0, "wse")[mb.segments[n] * C + c];
      }
    if (bert) x = layernorm(x, slot(0, "ln.weight"), slot(0, "ln.bias"), N, C);
    const uint8_t* mask = bert && !mb.key_mask.empty() ? mb.key_mask.data() : nullptr;
    for (int l = 1; l <= o.depth; ++l) {
      auto p = [&](const char* s) { return slot(l, s); };
      Vec h = layernorm(x, p("ln1.weight"), p("ln1.bias"), N, C);
      Vec qkv = linear(h, p("attn.qkv.weight"), p("attn.qkv.bias"), N, C, 3 * C);
      Vec y = attention(qkv, mask, !bert, B, T, C, o.heads);
      Vec a = linear(y, p("attn.proj.weight"), p("attn.proj.bias"), N, C, C);
      for (size_t i = 0; i < x.size(); ++i) x[i] += a[i];
      h = layernorm(x, p("ln2.weight"), p("ln2.bias"), N, C);
      Vec f = gelu(linear(h, p("mlp.fc.weight"), p("mlp.fc.bias"), N, C, 4 * C));
      Vec m = linear(f, p("mlp.proj.weight"), p("mlp.proj.bias"), N, 4 * C, C);
      for (size_t i = 0; i < x.size(); ++i) x[i] += m[i];
    }
    const int hl = o.depth + 1;
    auto p = [&](const char* s) { return slot(hl, s); };
    x = layernorm(x, p("ln_f.weight"), p("ln_f.bias"), N, C);
    if (!bert) return linear(x, o.tied ? wte : p("lm_head.weight"), nullptr, N, C, V);
    Vec d = gelu(linear(x, p("mlm.dense.weight"), p("mlm.dense.bias"), N, C, C));
    d = layernorm(d, p("mlm.ln.weight"), p("mlm.ln.bias"), N, C);
    return linear(d, o.tied ? wte : p("mlm.decoder.weight"), p("mlm.decoder.bias"), N, C, V);
  }

  /// Mean token loss over the non-ignored targets.
  double loss(const Microbatch& mb) const {
    const size_t V = model.options().vocab_size;
    const Vec z = logits(mb);
    double sum = 0;
    int count = 0;
    for (size_t n = 0; n < mb.targets.size(); ++n) {
      if (mb.targets[n] == kIgnoreIndex) continue;
      double mx = -INFINITY, se = 0;
      for (size_t v = 0; v < V; ++v) mx = std::max(mx, z[n * V + v]);
      for (size_t v = 0; v < V; ++v) se += std::exp(z[n * V + v] - mx);
      sum += mx + std::log(se) - z[n * V + mb.targets[n]];
      ++count;
    }
    return sum / count;
  }
};

/// Random parameters far from init (so every path carries gradient): weights N(0, 0.3),
/// norm weights 1 + N(0, 0.2), biases N(0, 0.1); tied copies equal their owners.
void randomize(ReferenceTrainer& tr, uint64_t seed) {
  const Model& m = tr.model();
  for (int i = 0; i < m.num_layers(); ++i) {
    for (const ParamSlot& s : m.layer(i).slots()) {
      NormalRng rng(derive_seed(seed, i, s.offset));
      const bool norm = s.init == InitKind::ones;
      const double std_dev = s.shape.size() >= 2 ? 0.3 : (norm ? 0.2 : 0.1);
      for (size_t k = 0; k < s.numel; ++k)
        tr.params(i)[s.offset + k] = static_cast<float>((norm ? 1.0 : 0.0) + std_dev * rng.next());
    }
  }
  for (const TiedParam& t : m.tied()) {
    const ParamSlot* a = m.layer(t.owner_layer).find_slot(t.owner_slot);
    const ParamSlot* b = m.layer(t.copy_layer).find_slot(t.copy_slot);
    std::memcpy(tr.params(t.copy_layer).data() + b->offset,
                tr.params(t.owner_layer).data() + a->offset, a->numel * sizeof(float));
  }
}

/// Checks every gradient entry of the trainer (after compute_gradients over `mbs`) against
/// central differences of the naive double model's step loss (1/m)·Σ meanⱼ.
void check_gradients(const ModelOptions& o, int B, int T) {
  ReferenceTrainer tr(build(o), OptimizerOptions{}, B, T);
  randomize(tr, 99);
  std::vector<Microbatch> mbs = {make_mb(o.arch, B, T, o.vocab_size, 1),
                                 make_mb(o.arch, B, T, o.vocab_size, 2)};
  const double loss = tr.compute_gradients(mbs);

  const Model& m = tr.model();
  Naive nv{m, {}};
  for (int i = 0; i < m.num_layers(); ++i)
    nv.P.emplace_back(tr.params(i).begin(), tr.params(i).end());
  auto J = [&] {
    double s = 0;
    for (const Microbatch& mb : mbs) s += nv.loss(mb);
    return s / static_cast<double>(mbs.size());
  };
  // Forward: f32 model vs double model; the difference is f32 rounding (~1e-7 relative).
  CHECK(loss == doctest::Approx(J()).epsilon(1e-5));

  // Central differences in double with h = 1e-5: truncation O(h²) ~1e-10, rounding
  // ~1e-16/h ~1e-11, so the reference is exact to ~1e-9. The analytic gradient is computed
  // in f32 (relative error ~1e-6 of the tensor's scale). Tolerance per entry:
  // |g − fd| <= 2e-5·max|fd| over the slot + 1e-3·|fd| (measured worst: 7e-7·max|fd|).
  const double h = 1e-5;
  size_t checked = 0;
  for (int i = 0; i < m.num_layers(); ++i) {
    const auto& slots = m.layer(i).slots();
    for (size_t si = 0; si < slots.size(); ++si) {
      const ParamSlot& s = slots[si];
      if (m.is_tied_copy(i, si)) continue;  // the naive model has one wte; checked below
      Vec fd(s.numel);
      for (size_t k = 0; k < s.numel; ++k) {
        double& p = nv.P[static_cast<size_t>(i)][s.offset + k];
        const double p0 = p;
        p = p0 + h;
        const double up = J();
        p = p0 - h;
        const double down = J();
        p = p0;
        fd[k] = (up - down) / (2 * h);
      }
      double scale = 0;
      for (double v : fd) scale = std::max(scale, std::abs(v));
      CAPTURE(m.param_name(i, s));
      CHECK(scale > 1e-6);  // every parameter influences the loss
      size_t bad = 0;
      double worst = 0;
      for (size_t k = 0; k < s.numel; ++k) {
        const double g = tr.grads(i)[s.offset + k];
        const double err = std::abs(g - fd[k]);
        worst = std::max(worst, err / scale);
        if (err > 2e-5 * scale + 1e-3 * std::abs(fd[k])) ++bad;
      }
      CAPTURE(worst);
      CHECK(bad == 0);
      checked += s.numel;
    }
  }
  CHECK(checked == m.unique_parameters());
  // The tied copy holds the same summed gradient, bitwise.
  for (const TiedParam& t : m.tied()) {
    const ParamSlot* a = m.layer(t.owner_layer).find_slot(t.owner_slot);
    const ParamSlot* b = m.layer(t.copy_layer).find_slot(t.copy_slot);
    CHECK(std::memcmp(tr.grads(t.owner_layer).data() + a->offset,
                      tr.grads(t.copy_layer).data() + b->offset, a->numel * sizeof(float)) == 0);
  }
}

}  // namespace

TEST_CASE("build validates the options and names the key") {
  ModelOptions o = tiny(Arch::gpt);
  o.heads = 3;
  auto m = Model::build(o);
  REQUIRE(!m.ok());
  CHECK(m.error().message.find("model.heads = 3") != std::string::npos);
  CHECK(m.error().message.find("model.width = 8") != std::string::npos);
  o = tiny(Arch::gpt);
  o.depth = 0;
  REQUIRE(!Model::build(o).ok());
  CHECK(Model::build(o).error().message.find("model.depth = 0") != std::string::npos);
  o = tiny(Arch::bert);
  o.segments = 0;
  CHECK(!Model::build(o).ok());
  o.vocab_size = 1;
  CHECK(!Model::build(o).ok());
}

TEST_CASE("GPT and BERT layer lists, slot names and parameter counts") {
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    const ModelOptions o = tiny(arch);
    const Model m = build(o);
    const bool gpt = arch == Arch::gpt;
    REQUIRE(m.num_layers() == o.depth + 2);
    CHECK(m.layer(0).type() == (gpt ? "gpt_embedding" : "bert_embedding"));
    CHECK(m.layer(0).role() == LayerRole::input);
    CHECK(!m.layer(0).takes_input());
    for (int l = 1; l <= o.depth; ++l) {
      CHECK(m.layer(l).type() == (gpt ? "gpt_block" : "bert_block"));
      CHECK(m.layer(l).role() == LayerRole::hidden);
      CHECK(m.layer(l).index() == l);
      CHECK(m.layer(l).takes_input());
      CHECK(!m.layer(l).is_loss());
    }
    CHECK(m.layer(o.depth + 1).is_loss());
    CHECK(m.layer(o.depth + 1).type() == (gpt ? "gpt_head" : "bert_head"));
    CHECK(to_string(m.layer(o.depth + 1).role()) == "loss");
    // slots are packed in order
    for (int i = 0; i < m.num_layers(); ++i) {
      size_t off = 0;
      for (const ParamSlot& s : m.layer(i).slots()) {
        CHECK(s.offset == off);
        off += s.numel;
      }
      CHECK(off == m.layer(i).param_floats());
    }
    const ParamSlot* qkv = m.layer(2).find_slot("attn.qkv.weight");
    REQUIRE(qkv);
    CHECK(qkv->shape == std::vector<int64_t>{3 * o.width, o.width});
    CHECK(m.param_name(2, *qkv) == "layers.2.attn.qkv.weight");
    // GPT-2 counting: V·C + maxT·C + L·(12C² + 13C) + 2C (+ BERT extras), wte counted once
    const size_t V = o.vocab_size, C = o.width, T = o.context, L = o.depth, S = o.segments;
    size_t expect = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
    if (!gpt) expect += S * C + 2 * C + (C * C + C) + 2 * C + V;
    CHECK(m.unique_parameters() == expect);
    CHECK(m.total_param_floats() == expect + V * C);
    REQUIRE(m.tied().size() == 1);
    CHECK(m.tied()[0].copy_slot == (gpt ? "lm_head.weight" : "mlm.decoder.weight"));
  }
  ModelOptions o = tiny(Arch::gpt);
  o.tied = false;
  const Model m = build(o);
  CHECK(m.tied().empty());
  CHECK(m.unique_parameters() == m.total_param_floats());
}

TEST_CASE("init: GPT-2 scheme, tied copies identical, independent of other layers") {
  ModelOptions o = tiny(Arch::gpt);
  o.width = 64;
  o.heads = 4;
  o.vocab_size = 256;
  o.depth = 3;
  const Model m = build(o);
  std::vector<std::vector<float>> p(static_cast<size_t>(m.num_layers()));
  for (int i = 0; i < m.num_layers(); ++i) {
    p[static_cast<size_t>(i)].assign(m.layer(i).param_floats(), NAN);
    m.init_layer(i, p[static_cast<size_t>(i)].data());
  }
  auto stats = [&](int i, const char* name) {
    const ParamSlot* s = m.layer(i).find_slot(name);
    REQUIRE(s);
    const float* x = p[static_cast<size_t>(i)].data() + s->offset;
    double sum = 0, sq = 0;
    for (size_t k = 0; k < s->numel; ++k) sum += x[k], sq += double(x[k]) * x[k];
    const double mean = sum / s->numel;
    return std::pair{mean, std::sqrt(sq / s->numel - mean * mean)};
  };
  // Sample std within 5% (>= 4096 samples each: the sampling error is ~1.1%).
  CHECK(stats(0, "wte").second == doctest::Approx(0.02).epsilon(0.05));
  CHECK(stats(2, "mlp.fc.weight").second == doctest::Approx(0.02).epsilon(0.05));
  CHECK(stats(2, "attn.proj.weight").second ==
        doctest::Approx(0.02 / std::sqrt(6.0)).epsilon(0.05));
  CHECK(stats(3, "mlp.proj.weight").second == doctest::Approx(0.02 / std::sqrt(6.0)).epsilon(0.05));
  CHECK(stats(2, "mlp.fc.weight").first == doctest::Approx(0.0).epsilon(0.002));
  CHECK(stats(1, "ln1.weight") == std::pair{1.0, 0.0});
  CHECK(stats(1, "attn.qkv.bias") == std::pair{0.0, 0.0});
  // tied copy is bitwise the embedding's wte
  const ParamSlot* wte = m.layer(0).find_slot("wte");
  const ParamSlot* lm = m.layer(4).find_slot("lm_head.weight");
  CHECK(std::memcmp(p[0].data() + wte->offset, p[4].data() + lm->offset,
                    wte->numel * sizeof(float)) == 0);
  // different streams per layer and per slot
  CHECK(std::memcmp(p[1].data() + m.layer(1).find_slot("mlp.fc.weight")->offset,
                    p[2].data() + m.layer(2).find_slot("mlp.fc.weight")->offset,
                    64 * sizeof(float)) != 0);
  // a layer's init depends on (seed, its index) only: a deeper model agrees on shared layers
  // except for the residual scale, and a rebuilt model agrees bitwise
  const Model again = build(o);
  for (int i = 0; i < m.num_layers(); ++i) {
    std::vector<float> q(again.layer(i).param_floats());
    again.init_layer(i, q.data());
    CHECK(std::memcmp(q.data(), p[static_cast<size_t>(i)].data(), q.size() * sizeof(float)) == 0);
  }
  ModelOptions deeper = o;
  deeper.depth = 5;
  const Model d = build(deeper);
  std::vector<float> q(d.layer(0).param_floats());
  d.init_layer(0, q.data());
  CHECK(std::memcmp(q.data(), p[0].data(), q.size() * sizeof(float)) == 0);
  q.assign(d.layer(2).param_floats(), 0.0f);
  d.init_layer(2, q.data());
  const ParamSlot* fc = d.layer(2).find_slot("mlp.fc.weight");
  CHECK(std::memcmp(q.data() + fc->offset, p[2].data() + fc->offset, fc->numel * sizeof(float)) ==
        0);
  // another seed gives other values
  ModelOptions other = o;
  other.init_seed = 6;
  q.assign(m.layer(0).param_floats(), 0.0f);
  build(other).init_layer(0, q.data());
  CHECK(std::memcmp(q.data(), p[0].data(), q.size() * sizeof(float)) != 0);
}

TEST_CASE("layers are stateless: interleaved microbatches with their own saved buffers") {
  // forward A, forward B, backward A, backward B (a pipeline stage's pattern) gives the same
  // bits as forward A, backward A, forward B, backward B, for every layer kind.
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    const ModelOptions o = tiny(arch);
    const Model m = build(o);
    const int B = 2, T = 6, C = o.width;
    const size_t NC = static_cast<size_t>(B) * T * C;
    Context ctx(1);
    const Microbatch a = make_mb(arch, B, T, o.vocab_size, 11);
    const Microbatch b = make_mb(arch, B, T, o.vocab_size, 12);
    for (int i = 0; i < m.num_layers(); ++i) {
      const Layer& layer = m.layer(i);
      CAPTURE(layer.type());
      std::vector<float> params(layer.param_floats());
      m.init_layer(i, params.data());
      NormalRng rng(77);
      std::vector<float> in_a(NC), in_b(NC), dout_a(NC), dout_b(NC);
      for (auto* v : {&in_a, &in_b, &dout_a, &dout_b})
        for (float& x : *v) x = static_cast<float>(rng.next());
      auto run = [&](bool interleaved) {
        std::vector<float> sa(layer.saved_floats(B, T)), sb(sa.size()), oa(NC), ob(NC);
        std::vector<float> da(NC), db(NC), g(layer.param_floats(), 0.0f);
        LossStats la, lb;
        auto fa = [&] {
          la = layer.forward(ctx, params.data(), a, in_a.data(), oa.data(), sa.data());
        };
        auto fb = [&] {
          lb = layer.forward(ctx, params.data(), b, in_b.data(), ob.data(), sb.data());
        };
        auto ba = [&] {
          layer.backward(ctx, params.data(), g.data(), a, in_a.data(), sa.data(), dout_a.data(),
                         da.data(), 0.25f, nullptr);
        };
        auto bb = [&] {
          layer.backward(ctx, params.data(), g.data(), b, in_b.data(), sb.data(), dout_b.data(),
                         db.data(), 0.25f, nullptr);
        };
        if (interleaved)
          fa(), fb(), ba(), bb();
        else
          fa(), ba(), fb(), bb();
        if (!layer.is_loss()) oa.insert(oa.end(), ob.begin(), ob.end());
        if (layer.takes_input())
          oa.insert(oa.end(), da.begin(), da.end()), oa.insert(oa.end(), db.begin(), db.end());
        oa.insert(oa.end(), g.begin(), g.end());
        oa.push_back(static_cast<float>(la.sum + lb.sum));
        return oa;
      };
      const auto x = run(false), y = run(true);
      REQUIRE(x.size() == y.size());
      CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE(
    "deferred weight gradients: din first, the same bits after run, dout may be overwritten") {
  // backward with a DeferredGrads: din is final on return and the linear weight gradients are
  // not there yet; after the caller overwrote dout and the arena, run() gives grads bitwise
  // equal to the one-pass backward. Embeddings (first layers) defer nothing. In bf16 too, where
  // the one-pass block backward fuses GELU's backward with the fc layer's operand and bias
  // gradient, and the deferred one does not.
  std::vector<Precision> precisions{Precision::fp32};
  if (bf16_support().native) precisions.push_back(Precision::bf16);
  for (const Precision precision : precisions)
    for (Arch arch : {Arch::gpt, Arch::bert}) {
      CAPTURE(to_string(precision));
      const ModelOptions o = tiny(arch);
      const Model m = build(o);
      const int B = 2, T = 6, C = o.width;
      const size_t NC = static_cast<size_t>(B) * T * C;
      Context ctx(2);
      ctx.set_precision(precision);
      const Microbatch mb = make_mb(arch, B, T, o.vocab_size, 13);
      DeferredGrads later;
      for (int i = 0; i < m.num_layers(); ++i) {
        const Layer& layer = m.layer(i);
        CAPTURE(layer.type());
        std::vector<float> params(layer.param_floats());
        m.init_layer(i, params.data());
        NormalRng rng(78);
        std::vector<float> in(NC), dout(NC), out(NC), saved(layer.saved_floats(B, T));
        for (auto* v : {&in, &dout})
          for (float& x : *v) x = static_cast<float>(rng.next());
        std::vector<float> g0(layer.param_floats());
        for (float& x : g0) x = static_cast<float>(rng.next());  // backward accumulates onto it
        layer.forward(ctx, params.data(), mb, in.data(), out.data(), saved.data());
        ctx.arena().reset();
        std::vector<float> din_one(NC), g_one = g0;
        layer.backward(ctx, params.data(), g_one.data(), mb, in.data(), saved.data(), dout.data(),
                       din_one.data(), 0.25f, nullptr);

        ctx.arena().reset();
        std::vector<float> din(NC), g = g0, dout_copy = dout;
        layer.backward(ctx, params.data(), g.data(), mb, in.data(), saved.data(), dout_copy.data(),
                       din.data(), 0.25f, &later);
        if (layer.takes_input()) {
          CHECK(std::memcmp(din.data(), din_one.data(), NC * sizeof(float)) == 0);
          CHECK(later.size() > 0);
          CHECK(std::memcmp(g.data(), g_one.data(), g.size() * sizeof(float)) != 0);
        } else {
          CHECK(later.empty());
        }
        std::fill(dout_copy.begin(), dout_copy.end(), 1e30f);
        ctx.arena().reset();
        std::fill_n(ctx.arena().alloc_f32(1 << 16), 1 << 16, -1e30f);
        later.run(ctx);
        CHECK(later.empty());
        CHECK(std::memcmp(g.data(), g_one.data(), g.size() * sizeof(float)) == 0);
      }
    }
}

TEST_CASE("loss_scale and count_targets") {
  CHECK(loss_scale(10, 4) == doctest::Approx(1.0 / 40));
  CHECK(loss_scale(0, 4) == 0.0f);
  Microbatch mb;
  mb.targets = {1, kIgnoreIndex, 3, kIgnoreIndex};
  CHECK(count_targets(mb) == 2);
}

TEST_CASE("finite differences: whole tiny GPT, every parameter") {
  check_gradients(tiny(Arch::gpt), 2, 6);
}

TEST_CASE("finite differences: whole tiny GPT, untied head") {
  ModelOptions o = tiny(Arch::gpt);
  o.tied = false;
  check_gradients(o, 2, 5);
}

TEST_CASE("finite differences: whole tiny BERT with padding, every parameter") {
  check_gradients(tiny(Arch::bert), 2, 6);
}

TEST_CASE("logits match the naive model") {
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    const ModelOptions o = tiny(arch);
    ReferenceTrainer tr(build(o), OptimizerOptions{}, 2, 8);
    randomize(tr, 3);
    const Microbatch mb = make_mb(arch, 2, 8, o.vocab_size, 4);
    const LossStats loss = tr.forward(mb);
    Naive nv{tr.model(), {}};
    for (int i = 0; i < tr.num_layers(); ++i)
      nv.P.emplace_back(tr.params(i).begin(), tr.params(i).end());
    const Vec z = nv.logits(mb);
    REQUIRE(tr.logits() != nullptr);
    // the rows the head computes: all of GPT's, BERT's masked positions only
    const std::vector<int> rows = tr.model().layer(tr.num_layers() - 1).logit_rows(mb);
    std::vector<int> counted;
    for (size_t i = 0; i < mb.targets.size(); ++i)
      if (arch == Arch::gpt || mb.targets[i] != kIgnoreIndex)
        counted.push_back(static_cast<int>(i));
    CHECK(rows == counted);
    const size_t V = static_cast<size_t>(o.vocab_size);
    double worst = 0, scale = 0;
    for (size_t j = 0; j < rows.size(); ++j) {
      for (size_t v = 0; v < V; ++v) {
        const double want = z[static_cast<size_t>(rows[j]) * V + v];
        worst = std::max(worst, std::abs(tr.logits()[j * V + v] - want));
        scale = std::max(scale, std::abs(want));
      }
    }
    CHECK(worst < 1e-5 * scale);
    CHECK(loss.count == count_targets(mb));
    CHECK(loss.mean() == doctest::Approx(nv.loss(mb)).epsilon(1e-5));
  }
}

namespace {

// A hidden layer of one's own: y = x (it has one parameter slot, "w", of shape (n, width)).
class Identity final : public Layer {
 public:
  Identity(int index, int n, int width, LayerRole role = LayerRole::hidden)
      : Layer(role, "identity", index, {[&] {
                ParamSlot s;
                s.name = "w";
                s.shape = {n, width};
                return s;  // zeros
              }()}) {}
  size_t saved_floats(int, int) const override { return 0; }
  LossStats forward(Context&, const float*, const Microbatch&, const float*, float*,
                    float*) const override {
    return {};
  }
  void backward(Context&, const float*, float*, const Microbatch&, const float*, const float*,
                const float*, float*, float, DeferredGrads*) const override {}
};

std::string from_layers_error(std::vector<std::shared_ptr<const Layer>> layers,
                              std::vector<TiedParam> tied = {}) {
  auto m = Model::from_layers(tiny(Arch::gpt), std::move(layers), std::move(tied));
  return m.ok() ? "built" : m.error().message;
}

}  // namespace

TEST_CASE("from_layers: a model of one's own layers, checked layer by layer") {
  const ModelOptions o = tiny(Arch::gpt);
  auto emb = internal::make_gpt_embedding(o, 0);
  auto head = internal::make_gpt_head(o, 2);
  auto mid = std::make_shared<Identity>(1, o.vocab_size, o.width);
  CHECK(from_layers_error({emb, mid, head}) == "built");
  auto m = Model::from_layers(o, {emb, mid, head});
  REQUIRE(m.ok());
  CHECK(m->options().depth == 1);  // the hidden layers
  CHECK(!m->options().tied);
  CHECK(m->layer(1).type() == "identity");
  CHECK(m->param_name(1, m->layer(1).slots()[0]) == "layers.1.w");

  CHECK(from_layers_error({emb, head}) ==
        "a model of 2 layers: needs an input layer, at least one hidden layer and a loss layer");
  CHECK(from_layers_error({emb, nullptr, head}) == "layer 1: null");
  CHECK(from_layers_error({emb, std::make_shared<Identity>(2, 3, 8), head}) ==
        "layer 1 (identity): was made with index 2; a layer's index is its position");
  CHECK(from_layers_error({emb, std::make_shared<Identity>(1, 3, 8, LayerRole::loss), head}) ==
        "layer 1 (identity): role loss, but layer 1 of 3 must be the hidden layer");
  CHECK(from_layers_error({mid, internal::make_gpt_embedding(o, 1), head})
            .find("layer 0 (identity): was made with index 1") == 0);
  CHECK(from_layers_error({emb, mid, head}, {{0, "wte", 2, "lm_head.wieght"}}) ==
        "tied copy layers.2.lm_head.wieght: layer 2 (gpt_head) has no slot \"lm_head.wieght\"");
  CHECK(from_layers_error({emb, mid, head}, {{0, "wpe", 2, "lm_head.weight"}}) ==
        "tied layers.0.wpe / layers.2.lm_head.weight: shapes (8, 8) and (20, 8) differ");
  CHECK(from_layers_error({emb, mid, head},
                          {{1, "w", 2, "lm_head.weight"}, {0, "wte", 2, "lm_head.weight"}})
            .find("a parameter is tied once") != std::string::npos);
  CHECK(from_layers_error({emb, mid, head}, {{5, "w", 2, "lm_head.weight"}}) ==
        "tied owner layer 5: outside [0, 3)");
  CHECK(from_layers_error({emb, mid, head}, {{2, "lm_head.weight", 0, "wte"}}) ==
        "tied layers.2.lm_head.weight / layers.0.wte: the owner must be in an earlier layer than "
        "its copy (the copy's stage uses the owner's values of the same microbatch); declare it "
        "the other way round");
}

TEST_CASE("a declared tie starts the copy as its owner, whatever the copy's own init says") {
  const ModelOptions o = tiny(Arch::gpt);
  // the identity's slot w (V, C) is zeros by its own init; tied to wte it starts as wte
  auto emb = internal::make_gpt_embedding(o, 0);
  auto mid = std::make_shared<Identity>(1, o.vocab_size, o.width);
  auto head = internal::make_gpt_head(o, 2);
  auto m = Model::from_layers(o, {emb, mid, head}, {{0, "wte", 1, "w"}});
  REQUIRE(m.ok());
  CHECK(m->options().tied);
  CHECK(m->is_tied_copy(1, 0));
  CHECK(m->unique_parameters() == m->total_param_floats() - mid->param_floats());
  std::vector<float> wte(emb->param_floats()), w(mid->param_floats());
  m->init_layer(0, wte.data());
  m->init_layer(1, w.data());
  CHECK(std::memcmp(w.data(), wte.data(), w.size() * sizeof(float)) == 0);
  CHECK(std::any_of(w.begin(), w.end(), [](float v) { return v != 0.0f; }));
  // untied, it keeps its own init
  auto untied = Model::from_layers(o, {emb, mid, head});
  REQUIRE(untied.ok());
  untied->init_layer(1, w.data());
  CHECK(std::all_of(w.begin(), w.end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("options_for_model: the config must describe the model given") {
  const ModelOptions o = tiny(Arch::gpt);
  const Model m = build(o);
  auto same = options_for_model(o, m);
  REQUIRE(same.ok());
  CHECK(same->depth == o.depth);
  ModelOptions other = o;
  other.width = 16;
  CHECK(options_for_model(other, m).error().message ==
        "model.width = 16, but the model given has 8");
  other = o;
  other.depth = 5;
  CHECK(options_for_model(other, m).error().message ==
        "model.depth = 5, but the model given has 2 hidden layers");
  other = o;
  other.init_seed = 9;
  CHECK(options_for_model(other, m).error().message ==
        "model.init_seed = 9, but the model given was built with 5");
  other = o;
  other.tied = false;  // taken from the model's declared ties
  CHECK(options_for_model(other, m)->tied);
}

TEST_CASE("reduce_tied_grads: both copies get owner + copy, the same over any threads") {
  const size_t n = 1000;
  std::vector<float> owner(n), copy(n);
  for (size_t k = 0; k < n; ++k) {
    owner[k] = 0.1f * static_cast<float>(k) + 1e-3f;
    copy[k] = -0.07f * static_cast<float>(k * k % 37);
  }
  std::vector<float> want_owner = owner, want_copy = copy;
  reduce_tied_grads(want_owner.data(), want_copy.data(), n);
  for (size_t k = 0; k < n; ++k) {
    CHECK(want_owner[k] == owner[k] + copy[k]);
    CHECK(want_copy[k] == want_owner[k]);
  }
  for (int threads : {1, 2, 3}) {
    Context ctx(threads);
    std::vector<float> o = owner, c = copy;
    reduce_tied_grads(ctx, o.data(), c.data(), n);
    CHECK(o == want_owner);
    CHECK(c == want_copy);
  }
}
