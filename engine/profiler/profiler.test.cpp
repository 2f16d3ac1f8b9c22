// Tests of the profiler: one timed cost per layer, named after its kind and index, every part
// timed, the same shape every time; the loaded variant records its load; bad arguments refused by
// name; the byte counts equal what a hand count of the tiny GPT's buffers gives.
#include "engine/profiler/profiler.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <string>

#include "kernels/bf16_gemm.hpp"
#include "tests/support/bf16_skip.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;

namespace {

ModelOptions small_gpt() {
  ModelOptions m;  // the defaults: V256 C128 L4 H4, tied
  m.context = 32;
  return m;
}

void check_layers(const LayerProfile& p) {
  REQUIRE(p.layers.size() == 6);  // embedding, 4 blocks, head
  CHECK(p.layers.front().name == "gpt_embedding 0");
  CHECK(p.layers[3].name == "gpt_block 3");
  CHECK(p.layers.back().name == "gpt_head 5");
  for (const LayerTiming& c : p.layers) {
    CAPTURE(c.name);
    CHECK(c.forward > 0.0);
    CHECK(c.backward > 0.0);
    CHECK(c.update > 0.0);
    CHECK(c.copy > 0.0);
    CHECK(c.predict > 0.0);
  }
  for (size_t i = 1; i < p.layers.size(); ++i) CHECK(p.layers[i].backward_weight > 0.0);
}

}  // namespace

TEST_CASE("a profile has one timed cost per layer, named by kind and index") {
  auto p = profile_layers(small_gpt(), OptimizerOptions{}, 2, 16, 1, 2);
  REQUIRE_MESSAGE(p.ok(), (p.ok() ? "" : p.error().message));
  check_layers(*p);
  CHECK(p->threads == 1);
  CHECK(p->B == 2);
  CHECK(p->T == 16);
  CHECK(p->reps == 2);
  CHECK(p->load_threads == 0);
  CHECK(p->tied);
}

TEST_CASE("profiles repeat in shape: the same layers, every time positive, at any thread count") {
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    auto a = profile_layers(small_gpt(), OptimizerOptions{}, 2, 16, threads, 3);
    auto b = profile_layers(small_gpt(), OptimizerOptions{}, 2, 16, threads, 3);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    check_layers(*a);
    check_layers(*b);
    for (size_t i = 0; i < a->layers.size(); ++i) CHECK(a->layers[i].name == b->layers[i].name);
    CHECK(a->threads == threads);
  }
  // BERT (segments, masked positions) and SGD profile too
  ModelOptions bert = small_gpt();
  bert.arch = Arch::bert;
  OptimizerOptions sgd;
  sgd.kind = "sgd";
  auto p = profile_layers(bert, sgd, 2, 16, 1, 1);
  REQUIRE_MESSAGE(p.ok(), (p.ok() ? "" : p.error().message));
  REQUIRE(p->layers.size() == 6);
  CHECK(p->layers.front().name == "bert_embedding 0");
  CHECK(p->layers.back().name == "bert_head 5");
  for (const LayerTiming& c : p->layers) CHECK(c.forward > 0.0);
}

namespace {
std::atomic<int> bf16_products{0};
void count_bf16(const Bf16GemmCall&) {
  bf16_products.fetch_add(1);
}
}  // namespace

TEST_CASE("a bf16 profile times bf16 products, an fp32 one none") {
  if (actorpipe::testing::skip_without_bf16()) return;
  set_bf16_gemm_observer(&count_bf16);
  bf16_products = 0;
  REQUIRE(profile_layers(small_gpt(), OptimizerOptions{}, 2, 16, 1, 1).ok());
  CHECK(bf16_products.load() == 0);
  REQUIRE(profile_layers(small_gpt(), OptimizerOptions{}, 2, 16, 1, 1, Precision::bf16).ok());
  CHECK(bf16_products.load() > 0);
  set_bf16_gemm_observer(nullptr);
}

TEST_CASE("a loaded profile runs with other threads computing and records them") {
  auto p = profile_layers_loaded(small_gpt(), OptimizerOptions{}, 2, 16, 1, 1, 2);
  REQUIRE_MESSAGE(p.ok(), (p.ok() ? "" : p.error().message));
  check_layers(*p);
  CHECK(p->load_threads == 2);
  auto none = profile_layers_loaded(small_gpt(), OptimizerOptions{}, 2, 16, 2, 1, 0);
  REQUIRE(none.ok());
  CHECK(none->load_threads == 0);
  CHECK(none->threads == 2);
}

TEST_CASE("bad profile arguments are refused with their names and values") {
  auto e = profile_layers(small_gpt(), OptimizerOptions{}, 0, 16, 1, 1);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("B = 0") != std::string::npos);
  e = profile_layers(small_gpt(), OptimizerOptions{}, 2, 33, 1, 1);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("T = 33") != std::string::npos);
  CHECK(e.error().message.find("context (32)") != std::string::npos);
  e = profile_layers_loaded(small_gpt(), OptimizerOptions{}, 2, 16, 1, 1, -1);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("load_threads = -1") != std::string::npos);
  // the loaded variant checks its own arguments before it starts any thread
  e = profile_layers_loaded(small_gpt(), OptimizerOptions{}, 2, 16, 0, 1, 1);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("threads = 0") != std::string::npos);
  auto b = layer_bytes(small_gpt(), OptimizerOptions{}, 2, 0);
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().message ==
        "layer bytes: B = 2, T = 0: expected B >= 1 and 1 <= T <= context (32)");
}

TEST_CASE("layer bytes of the tiny GPT equal a hand count of its buffers") {
  // V = 24, context 8, C = 8, 2 blocks, 2 heads, tied; microbatches of B = 2, T = 6 (N = 12)
  const ModelOptions m = testing::tiny_model(Arch::gpt, true, 1);
  auto b = layer_bytes(m, OptimizerOptions{}, testing::kB, testing::kT);
  REQUIRE_MESSAGE(b.ok(), (b.ok() ? "" : b.error().message));
  REQUIRE(b->size() == 4);
  const std::int64_t hidden = 2 * 6 * 8 * 4;  // (B, T, C) floats: 384 bytes
  // embedding: wte (V, C) + wpe (context, C) = 192 + 64 floats; no saved activations, and its
  // input (token ids) is not counted
  const LayerCosts& e = (*b)[0];
  CHECK(e.parameter_bytes == 256 * 4);
  CHECK(e.gradient_bytes == 256 * 4);
  CHECK(e.version_bytes == 256 * 4);
  CHECK(e.weight_copy_bytes == 0);          // fp32: the products read the versions themselves
  CHECK(e.optimizer_bytes == 2 * 256 * 4);  // AdamW: m and v
  CHECK(e.activation_bytes == 0);
  CHECK(e.recompute_activation_bytes == 0);
  CHECK(e.output_bytes == hidden);
  // block: 12 C² + 13 C = 768 + 104 floats; saved: 15 N·C + 4 N + B·NH·T² = 1440 + 48 + 144
  // floats, plus its (N, C) input; recompute keeps the input alone
  for (int i : {1, 2}) {
    const LayerCosts& k = (*b)[static_cast<size_t>(i)];
    CAPTURE(i);
    CHECK(k.parameter_bytes == 872 * 4);
    CHECK(k.gradient_bytes == 872 * 4);
    CHECK(k.optimizer_bytes == 2 * 872 * 4);
    CHECK(k.activation_bytes == (1632 + 96) * 4);
    CHECK(k.recompute_activation_bytes == hidden);
    CHECK(k.output_bytes == hidden);
  }
  // head: ln_f (2 C) + its own copy of the tied (V, C) matrix = 16 + 192 floats; saved: the
  // normalised input N·C, mean and rstd 2 N, logits N·V, each row's largest logit and
  // exponentials' sum 2 N = 96 + 24 + 288 + 24 floats, plus its input; it hands nothing on
  const LayerCosts& h = (*b)[3];
  CHECK(h.parameter_bytes == 208 * 4);
  CHECK(h.optimizer_bytes == 2 * 208 * 4);
  CHECK(h.activation_bytes == (432 + 96) * 4);
  CHECK(h.recompute_activation_bytes == hidden);
  CHECK(h.output_bytes == 0);
  // SGD keeps one momentum per parameter
  OptimizerOptions sgd;
  sgd.kind = "sgd";
  auto s = layer_bytes(m, sgd, testing::kB, testing::kT);
  REQUIRE(s.ok());
  CHECK((*s)[1].optimizer_bytes == 872 * 4);
  // bf16: each stored version has a copy of 2 bytes a value, and a block keeps ln1, qkv, the
  // attention output, ln2 and GELU's output (5 · N·C of its floats, N·C = 96) in bf16
  auto h16 = layer_bytes(m, OptimizerOptions{}, testing::kB, testing::kT, Precision::bf16);
  REQUIRE(h16.ok());
  CHECK((*h16)[0].weight_copy_bytes == 256 * 2);
  CHECK((*h16)[1].weight_copy_bytes == 872 * 2);
  CHECK((*h16)[3].weight_copy_bytes == 208 * 2);
  CHECK((*h16)[1].version_bytes == 872 * 4);
  CHECK((*h16)[1].activation_bytes == (1632 - 480 + 96) * 4);
  CHECK((*h16)[0].activation_bytes == (*b)[0].activation_bytes);  // the embedding: all f32
  // a bf16 stash: a stored version keeps a block's four matrices (12 C² = 768 floats) as their
  // bf16 copy only; the embedding and the head (tied) keep theirs in f32
  auto s16 = layer_bytes(m, OptimizerOptions{}, testing::kB, testing::kT, Precision::bf16, true);
  REQUIRE(s16.ok());
  CHECK((*s16)[1].version_bytes == (872 - 768) * 4);
  CHECK((*s16)[1].weight_copy_bytes == 872 * 2);
  CHECK((*s16)[0].version_bytes == 256 * 4);
  CHECK((*s16)[3].version_bytes == 208 * 4);
}

TEST_CASE("layer_costs puts a profile's times on the model's bytes") {
  const ModelOptions m = testing::tiny_model(Arch::gpt, true, 1);
  auto p = profile_layers(m, OptimizerOptions{}, testing::kB, testing::kT, 1, 1);
  REQUIRE(p.ok());
  auto c = layer_costs(*p, m, OptimizerOptions{});
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? "" : c.error().message));
  auto b = layer_bytes(m, OptimizerOptions{}, testing::kB, testing::kT);
  REQUIRE(b.ok());
  REQUIRE(c->size() == b->size());
  for (size_t i = 0; i < c->size(); ++i) {
    const LayerCosts& x = (*c)[i];
    CHECK(x.forward == p->layers[i].forward);
    CHECK(x.backward == p->layers[i].backward);
    CHECK(x.update == p->layers[i].update);
    CHECK(x.backward_weight <= x.backward);
    CHECK(x.activation_bytes == (*b)[i].activation_bytes);
    CHECK(x.parameter_bytes == (*b)[i].parameter_bytes);
  }
  CHECK(check_layer_costs(*c).ok());
  auto c16 = layer_costs(*p, m, OptimizerOptions{}, Precision::bf16);
  REQUIRE(c16.ok());
  CHECK((*c16)[1].weight_copy_bytes == (*b)[1].parameter_bytes / 2);
  // a profile of another model is refused
  ModelOptions deeper = m;
  deeper.depth = 3;
  auto wrong = layer_costs(*p, deeper, OptimizerOptions{});
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.error().message == "layer costs: the profile has 4 layers but the model has 5");
}
