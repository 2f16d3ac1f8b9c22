// Sampler tests: picking a token (greedy, temperature, top-k, seeded); a GPT trained on the
// synthetic Markov chain samples text whose transitions are the chain's, with the chain's
// frequencies; weights from a checkpoint; on a backend whose memory is closed to the host, the
// CPU's logits and tokens bit for bit; BERT refused.
#include "engine/sampling/sampler.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <vector>

#include "engine/checkpoint/checkpoint.hpp"
#include "engine/data/loader.hpp"
#include "engine/data/markov.hpp"
#include "engine/execution/reference_trainer.hpp"
#include "kernels/checked_backend.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/temp_dir.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

ModelOptions small_gpt() {
  ModelOptions o;
  o.arch = Arch::gpt;
  o.vocab_size = 12;
  o.context = 16;
  o.width = 32;
  o.depth = 1;
  o.heads = 2;
  o.init_seed = 3;
  return o;
}

std::vector<std::vector<float>> params_of(ReferenceTrainer& tr) {
  std::vector<std::vector<float>> out;
  for (int i = 0; i < tr.num_layers(); ++i)
    out.emplace_back(tr.params(i).begin(), tr.params(i).end());
  return out;
}

}  // namespace

TEST_CASE("pick_token: greedy, top-k, temperature, seeded") {
  const std::vector<float> logits{1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
  SplitMix64 rng(1);
  CHECK(pick_token(logits, 0.0, 0, rng) == 1);  // the lowest id among the largest
  for (int i = 0; i < 50; ++i) CHECK(pick_token(logits, 2.0, 1, rng) == 1);  // top-1 is greedy
  // top-2 draws only ids 1 and 2, half each
  std::map<int32_t, int> top2;
  for (int i = 0; i < 4000; ++i) ++top2[pick_token(logits, 1.0, 2, rng)];
  CHECK(top2.size() == 2);
  CHECK(std::abs(top2[1] - 2000) < 200);
  // temperature 1 over all: the softmax frequencies
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < p.size(); ++i) z += p[i] = std::exp(logits[i]);
  std::vector<int> n(logits.size(), 0);
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) ++n[static_cast<size_t>(pick_token(logits, 1.0, 0, rng))];
  for (size_t i = 0; i < p.size(); ++i) {
    const double want = p[i] / z;
    CHECK(std::abs(n[i] / double(draws) - want) < 4 * std::sqrt(want * (1 - want) / draws) + 1e-3);
  }
  // the same seed, the same draws
  SplitMix64 a(7), b(7);
  for (int i = 0; i < 100; ++i)
    CHECK(pick_token(logits, 0.7, 3, a) == pick_token(logits, 0.7, 3, b));
  CHECK(check_sample_options({10, -1.0, 0, 1}).error().message ==
        "sample temperature = -1: must be >= 0 (0 = greedy)");
  CHECK(check_sample_options({10, 1.0, -2, 1}).error().message ==
        "sample top-k = -2: must be >= 0 (0 = all)");
}

TEST_CASE("a GPT trained on the synthetic chain samples the chain: its edges, its frequencies" *
          doctest::timeout(120)) {
  const ModelOptions o = small_gpt();
  DataOptions d;
  d.synthetic_branching = 2;
  const int B = 8, T = 16;
  auto data = DataLoader::open(d, Arch::gpt, o.vocab_size, B, T);
  REQUIRE(data.ok());
  auto chain = MarkovChain::random(o.vocab_size, d.synthetic_branching, d.synthetic_seed);
  REQUIRE(chain.ok());
  OptimizerOptions opt;
  opt.lr = 1e-2f;
  ReferenceTrainer tr(Model::build(o).value(), opt, B, T);
  double loss = 0;
  for (int step = 0; step < 300; ++step) {
    std::vector<Microbatch> mbs;
    for (int j = 0; j < 2; ++j) mbs.push_back((*data)->next());
    loss = tr.step(mbs);
  }
  CAPTURE(loss);
  CHECK(loss < chain->entropy_rate() + 0.05);  // trained close to the floor
  auto sampler = Sampler::create(tr.model(), params_of(tr));
  REQUIRE(sampler.ok());

  SampleOptions so;
  so.tokens = 3000;
  so.seed = 5;
  auto text = (*sampler)->generate(std::vector<int32_t>{0}, so);
  REQUIRE(text.ok());
  REQUIRE(text->size() == 3001);
  // every transition is an edge of the chain (almost: the model is not exact)
  std::map<int, std::map<int, int>> counts;
  int off_chain = 0;
  for (size_t t = 0; t + 1 < text->size(); ++t) {
    const int a = (*text)[t], b = (*text)[t + 1];
    if (chain->transition(a, b) == 0.0) ++off_chain;
    ++counts[a][b];
  }
  CHECK(off_chain < 30);  // < 1%
  // and the frequencies are the chain's: total variation per state, weighted by visits
  double tv = 0;
  int visits = 0;
  for (const auto& [a, row] : counts) {
    int n = 0;
    for (const auto& [b, c] : row) n += c;
    double dist = 0;
    for (int b = 0; b < o.vocab_size; ++b) {
      const auto it = row.find(b);
      const double f = it == row.end() ? 0.0 : it->second / double(n);
      dist += std::abs(f - chain->transition(a, b));
    }
    tv += 0.5 * dist * n;
    visits += n;
  }
  tv /= visits;
  CAPTURE(tv);
  CHECK(tv < 0.06);
  // greedy: each next token is the chain's most likely successor, the same whatever the seed
  so.temperature = 0.0;
  so.tokens = 40;
  auto g1 = (*sampler)->generate(std::vector<int32_t>{0}, so);
  so.seed = 99;
  auto g2 = (*sampler)->generate(std::vector<int32_t>{0}, so);
  REQUIRE(g1.ok());
  CHECK(*g1 == *g2);
  int best = 0;
  for (size_t t = 0; t + 1 < g1->size(); ++t) {
    const auto succ = chain->successors((*g1)[t]);
    const auto prob = chain->probabilities((*g1)[t]);
    const size_t top =
        static_cast<size_t>(std::max_element(prob.begin(), prob.end()) - prob.begin());
    best += succ[top] == (*g1)[t + 1] ? 1 : 0;
  }
  CHECK(best >= 36);
  // a context longer than model.context: its last tokens are what the model sees
  std::vector<int32_t> long_context(40, 1);
  long_context.back() = 4;
  const auto l1 = std::vector<float>((*sampler)->next_logits(long_context).begin(),
                                     (*sampler)->next_logits(long_context).end());
  const std::vector<int32_t> tail(long_context.end() - o.context, long_context.end());
  const auto l2 = (*sampler)->next_logits(tail);
  CHECK(std::equal(l1.begin(), l1.end(), l2.begin()));
}

TEST_CASE("weights from a checkpoint: the same logits, a model that differs is named") {
  TempDir tmp;
  const ModelOptions o = small_gpt();
  ReferenceTrainer tr(Model::build(o).value(), OptimizerOptions{}, 2, 8);
  CheckpointContents c;
  c.info.model = o;
  c.info.step = 3;
  for (int i = 0; i < tr.num_layers(); ++i) {
    for (const ParamSlot& s : tr.model().layer(i).slots()) {
      NamedTensor t;
      t.name = tr.model().param_name(i, s);
      t.dtype = "F32";
      t.shape = s.shape;
      t.f32.assign(tr.params(i).begin() + static_cast<std::ptrdiff_t>(s.offset),
                   tr.params(i).begin() + static_cast<std::ptrdiff_t>(s.offset + s.numel));
      c.model.push_back(std::move(t));
    }
  }
  auto path = save_checkpoint(tmp.file("ckpt"), c);
  REQUIRE_MESSAGE(path.ok(), (path.ok() ? "" : path.error().message));
  auto loaded = Sampler::from_checkpoint(o, tmp.file("ckpt"));
  REQUIRE_MESSAGE(loaded.ok(), (loaded.ok() ? "" : loaded.error().message));
  CHECK((*loaded)->source() == *path);
  auto direct = Sampler::create(tr.model(), params_of(tr));
  REQUIRE(direct.ok());
  const std::vector<int32_t> ctx{1, 2, 3};
  const std::vector<float> a((*loaded)->next_logits(ctx).begin(),
                             (*loaded)->next_logits(ctx).end());
  const auto b = (*direct)->next_logits(ctx);
  CHECK(std::equal(a.begin(), a.end(), b.begin()));
  ModelOptions wider = o;
  wider.width = 64;
  auto refused = Sampler::from_checkpoint(wider, *path);
  REQUIRE(!refused.ok());
  CHECK(refused.error().message.find("width") != std::string::npos);
}

TEST_CASE("on a backend off the host: the weights in its memory, the CPU's logits and tokens") {
  // a CheckedBackend's memory faults on any host touch between its ops: the forward runs on it,
  // and only the last position's logits come back
  ModelOptions o = small_gpt();
  o.depth = 2;
  ReferenceTrainer tr(Model::build(o).value(), OptimizerOptions{}, 2, 8);
  Context kernels(1);
  CheckedBackend checked(kernels);
  auto cpu = Sampler::create(tr.model(), params_of(tr));
  auto dev = Sampler::create(tr.model(), params_of(tr), 1, &checked);
  REQUIRE(cpu.ok());
  REQUIRE(dev.ok());
  CHECK((*cpu)->device().rfind("cpu", 0) == 0);
  CHECK((*dev)->device() == checked.name());
  const long ops_before = checked.ops();
  // contexts shorter than, equal to and longer than model.context
  for (size_t n : {size_t{1}, size_t{5}, size_t{16}, size_t{23}}) {
    CAPTURE(n);
    std::vector<int32_t> ctx(n);
    for (size_t i = 0; i < n; ++i) ctx[i] = static_cast<int32_t>((7 * i + 3) % 12);
    const auto a = (*cpu)->next_logits(ctx);
    const std::vector<float> want(a.begin(), a.end());
    CHECK(same_bits((*dev)->next_logits(ctx), want));
  }
  CHECK(checked.ops() > ops_before);
  for (double temperature : {0.0, 0.8}) {
    SampleOptions so;
    so.tokens = 30;
    so.temperature = temperature;
    so.top_k = 5;
    so.seed = 11;
    auto ta = (*cpu)->generate(std::vector<int32_t>{2, 5}, so);
    auto tb = (*dev)->generate(std::vector<int32_t>{2, 5}, so);
    REQUIRE(ta.ok());
    REQUIRE(tb.ok());
    CHECK(*ta == *tb);
  }
}

TEST_CASE("BERT is refused, bad prompts are errors") {
  ModelOptions b = small_gpt();
  b.arch = Arch::bert;
  b.segments = 2;
  ReferenceTrainer tr(Model::build(b).value(), OptimizerOptions{}, 1, 4);
  auto s = Sampler::create(tr.model(), params_of(tr));
  REQUIRE(!s.ok());
  CHECK(s.error().message.find("layer 2 (bert_head) does not") != std::string::npos);
  ReferenceTrainer g(Model::build(small_gpt()).value(), OptimizerOptions{}, 1, 4);
  auto gpt = Sampler::create(g.model(), params_of(g));
  REQUIRE(gpt.ok());
  CHECK((*gpt)->generate(std::vector<int32_t>{}, {}).error().message ==
        "sampling needs a prompt of at least one token");
  CHECK((*gpt)->generate(std::vector<int32_t>{3, 12}, {}).error().message ==
        "prompt token 1 = 12: outside [0, vocab_size = 12)");
}
