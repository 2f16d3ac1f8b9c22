// pipeline.precision: the names and the machine check; bf16 training of a GPT and a BERT on the
// synthetic corpus follows fp32's loss within a stated margin over 300 steps.
#include "engine/execution/compute_precision.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/execution/serial_executor.hpp"
#include "engine/execution/stage_worker.hpp"
#include "engine/mode.hpp"
#include "engine/model/partition.hpp"
#include "kernels/bf16_gemm.hpp"
#include "kernels/bf16_weights.hpp"
#include "tests/support/bf16_skip.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/tiny_model.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

TEST_CASE("resolve_precision: fp32 always, bf16 where the CPU has bf16 instructions") {
  CHECK(resolve_precision("fp32").value() == Precision::fp32);
  auto bad = resolve_precision("fp16");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message ==
        "pipeline.precision = \"fp16\": unknown precision (allowed: fp32, bf16)");
  auto b = resolve_precision("bf16");
  if (bf16_support().native) {
    CHECK(b.value() == Precision::bf16);
  } else {
    REQUIRE_FALSE(b.ok());
    CHECK(b.error().message.find("this CPU has no bf16 instructions") != std::string::npos);
    // emulated products where oneDNN has them (AVX-512), none at all below it
    CHECK(b.error().message.find(bf16_support().products
                                     ? "emulated bf16 products would be slower than fp32"
                                     : "without AVX-512 oneDNN cannot compute bf16 products") !=
          std::string::npos);
  }
}

namespace {

// The mean loss of each of `steps` steps of a 2-stage 1f1b pipeline in `precision`.
std::vector<double> train(Arch arch, const std::string& precision, int steps) {
  ModelOptions m = tiny_model(arch, true, 7);
  m.vocab_size = 32;
  m.context = 16;
  m.width = 32;
  m.heads = 2;
  Config c = tiny_config("1f1b", 2, 2, m);
  c.pipeline.microbatch_size = 4;
  c.pipeline.seq_len = 16;
  c.pipeline.precision = precision;
  c.optimizer.lr = 3e-3f;
  auto ex = SerialExecutor::create(c);
  REQUIRE_MESSAGE(ex.ok(), (ex.ok() ? "" : ex.error().message));
  auto data = config_loader(c);
  auto losses = (*ex)->run(steps, *data);
  REQUIRE(losses.ok());
  return *losses;
}

double mean_of_last(const std::vector<double>& v, size_t n) {
  return std::accumulate(v.end() - static_cast<long>(n), v.end(), 0.0) / static_cast<double>(n);
}

// A bf16 pipeline of d stages × `threads`, m microbatches per step, of the tiny batch shape.
SerialExecutorOptions bf16_options(Mode mode, int m, int d, int threads) {
  SerialExecutorOptions o;
  o.mode = mode;
  o.microbatches = m;
  o.B = kB;
  o.T = kT;
  o.threads.assign(static_cast<size_t>(d), threads);
  o.precision = Precision::bf16;
  return o;
}

std::unique_ptr<SerialExecutor> create(const Model& model, const Partition& p,
                                       const SerialExecutorOptions& o) {
  auto e = SerialExecutor::create(model, p, clipped_adamw(), o);
  REQUIRE_MESSAGE(e.ok(), (e.ok() ? "" : e.error().message));
  return std::move(e).value();
}

}  // namespace

TEST_CASE("bf16 training follows fp32's loss within 1% over 300 steps, GPT and BERT") {
  if (actorpipe::testing::skip_without_bf16()) return;
  for (Arch arch : {Arch::gpt, Arch::bert}) {
    CAPTURE(static_cast<int>(arch));
    const auto f = train(arch, "fp32", 300), b = train(arch, "bf16", 300);
    const double lf = mean_of_last(f, 50), lb = mean_of_last(b, 50);
    MESSAGE(std::string(arch == Arch::gpt ? "GPT" : "BERT")
            << ": loss " << f.front() << " -> " << lf << " (fp32), " << b.front() << " -> " << lb
            << " (bf16), mean of the last 50 steps");
    CHECK(lf < 0.9 * f.front());  // it learns: the comparison is not of two flat lines
    CHECK(std::fabs(lb - lf) <= 0.01 * lf);
    for (double x : b) REQUIRE(std::isfinite(x));
  }
}

TEST_CASE("bf16 weight copies made once per version compute the bits of a copy per product") {
  if (actorpipe::testing::skip_without_bf16()) return;
  // every mode, GPT (tied: the copy stage installs the owner's value into its weights) and BERT,
  // two runs (2bw continues the first), an evaluation, and weights overwritten between runs as a
  // checkpoint load does: a stale copy anywhere would change bits
  for (const char* mode_name : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    for (Arch arch : {Arch::gpt, Arch::bert}) {
      for (int d : {2, 3}) {
        CAPTURE(mode_name);
        CAPTURE(static_cast<int>(arch));
        CAPTURE(d);
        const Mode mode = *parse_mode(mode_name);
        const Model model = build_model(tiny_model(arch, true, 5));
        const Partition p = *Partition::even(model.num_layers(), d);
        const int m = mode == Mode::pipedream ? 1 : d + 1;
        auto make = [&](bool copies) {
          SerialExecutorOptions o = bf16_options(mode, m, d, 2);
          o.bf16_weight_copies = copies;
          return create(model, p, o);
        };
        auto once = make(true), each = make(false);
        const int steps = mode == Mode::pipedream ? 6 : 3;
        const auto batches = tiny_batches(arch, model.options().vocab_size, 4 * steps * m, 9);
        std::span<const Microbatch> all(batches);
        size_t at = 0;
        for (int run = 0; run < 2; ++run) {
          const auto n = static_cast<size_t>(once->microbatches_for(steps));
          auto lo = once->run(steps, all.subspan(at, n));
          auto le = each->run(steps, all.subspan(at, n));
          at += n;
          REQUIRE(lo.ok());
          REQUIRE(le.ok());
          CHECK(same_bits(*lo, *le));
          auto eo = once->evaluate(all.subspan(0, 2)), ee = each->evaluate(all.subspan(0, 2));
          REQUIRE(eo.ok());
          REQUIRE(ee.ok());
          CHECK(eo->loss == ee->loss);
          if (run == 0) {
            // as a checkpoint load would: new values written into the newest weights
            for (SerialExecutor* e : {once.get(), each.get()})
              for (int r = 0; r < d; ++r)
                for (int i = 0; i < e->worker(r).num_layers(); ++i)
                  for (float& w : e->worker(r).mutable_params(i)) w *= 0.75f;
          }
        }
        for (int i = 0; i < model.num_layers(); ++i)
          CHECK(same_bits(once->params(i), each->params(i)));
        // fewer conversions: at most one per weight matrix and version change, not per product;
        // the updates wrote the copies of their product operands in their own pass
        uint64_t made = 0, marked = 0;
        for (int r = 0; r < d; ++r) {
          const Bf16Weights* w = once->worker(r).context().bf16_weights();
          REQUIRE(w != nullptr);
          made += w->copies_made();
          marked += w->copies_marked();
          CHECK(each->worker(r).context().bf16_weights() == nullptr);
        }
        CHECK(made > 0);
        CHECK(marked > 0);
      }
    }
  }
}

TEST_CASE("a version's bf16 weight copies outlive the other versions' updates") {
  if (actorpipe::testing::skip_without_bf16()) return;
  // After the first run's copies of version 0, every new version's product operands come
  // rounded from its update's own pass: a second run converts none, but for a tied decoder that
  // follows its owner (2bw and pipedream install the owner's value into the last stage's
  // versions): at most two per update. Before copies were kept per buffer and layer, every
  // update forgot every copy of its stage (the first stage made its 4 again each step, the last
  // 6 per update in 1f1b and 2bw); before the decoder was a product operand, no update rounded
  // it (one conversion per version).
  for (const char* mode_name : {"1f1b", "2bw", "pipedream"}) {
    for (bool tied : {false, true}) {
      CAPTURE(mode_name);
      CAPTURE(tied);
      const Mode mode = *parse_mode(mode_name);
      const int d = 2;
      const Model model = build_model(tiny_model(Arch::bert, tied, 5));
      const Partition p = *Partition::even(model.num_layers(), d);
      const int m = mode == Mode::pipedream ? 1 : d + 1;
      auto e = create(model, p, bf16_options(mode, m, d, 1));
      SerialExecutor& ex = *e;
      const int steps = mode == Mode::pipedream ? 8 : 4;
      const auto batches = tiny_batches(Arch::bert, model.options().vocab_size, 2 * steps * m, 9);
      std::span<const Microbatch> all(batches);
      const auto n = static_cast<size_t>(ex.microbatches_for(steps));
      auto made = [&](int r) { return ex.worker(r).context().bf16_weights()->copies_made(); };
      REQUIRE(ex.run(steps, all.subspan(0, n)).ok());
      const uint64_t first0 = made(0), first1 = made(1);
      REQUIRE(ex.run(steps, all.subspan(n, n)).ok());
      CHECK(first0 > 0);
      CHECK(first1 > 0);
      CHECK(made(0) == first0);
      if (tied && tied_sync(mode) == TiedSync::follow_owner) {
        // one update per step (pipedream: per microbatch, m = 1)
        CHECK(made(1) - first1 <= static_cast<uint64_t>(2 * steps));
      } else {
        CHECK(made(1) == first1);
      }
      CHECK(ex.worker(1).context().bf16_weights()->copies_marked() > 0);
    }
  }
}

TEST_CASE("a bf16 weight stash computes the bits of an f32 one, in fewer bytes") {
  if (actorpipe::testing::skip_without_bf16()) return;
  // 2bw and pipedream (the modes that keep versions besides the newest), GPT (tied: the head's
  // copy of the embedding stays f32) and BERT, two runs (2bw continues the first), evaluations,
  // and weights written between runs into the newest and, in 2bw, the previous version
  for (const char* mode_name : {"2bw", "pipedream"}) {
    for (Arch arch : {Arch::gpt, Arch::bert}) {
      for (int d : {2, 3}) {
        CAPTURE(mode_name);
        CAPTURE(static_cast<int>(arch));
        CAPTURE(d);
        const Mode mode = *parse_mode(mode_name);
        ModelOptions mo = tiny_model(arch, true, 5);
        mo.width = 64;  // linear weights of several pages each: the stash gives pages back
        mo.heads = 4;
        const Model model = build_model(mo);
        const Partition p = *Partition::even(model.num_layers(), d);
        const int m = mode == Mode::pipedream ? 1 : d + 1;
        auto make = [&](bool stash) {
          SerialExecutorOptions o = bf16_options(mode, m, d, 2);
          o.bf16_stash = stash;
          return create(model, p, o);
        };
        auto stash = make(true), f32 = make(false);
        const int steps = mode == Mode::pipedream ? 6 : 3;
        const auto batches = tiny_batches(arch, model.options().vocab_size, 4 * steps * m, 9);
        std::span<const Microbatch> all(batches);
        size_t at = 0;
        for (int run = 0; run < 2; ++run) {
          const auto n = static_cast<size_t>(stash->microbatches_for(steps));
          auto ls = stash->run(steps, all.subspan(at, n));
          auto lf = f32->run(steps, all.subspan(at, n));
          at += n;
          REQUIRE(ls.ok());
          REQUIRE(lf.ok());
          CHECK(same_bits(*ls, *lf));
          auto es = stash->evaluate(all.subspan(0, 2)), ef = f32->evaluate(all.subspan(0, 2));
          REQUIRE(es.ok());
          REQUIRE(ef.ok());
          CHECK(es->loss == ef->loss);
          if (run == 0) {
            for (SerialExecutor* e : {stash.get(), f32.get()}) {
              for (int r = 0; r < d; ++r) {
                StageWorker& w = e->worker(r);
                for (int i = 0; i < w.num_layers(); ++i) {
                  for (float& x : w.mutable_params(i)) x *= 0.75f;
                  // new values into the previous version, as a resume restores it (the f32
                  // stash keeps them, the bf16 one rounds them: the products read the same)
                  if (w.holds_previous()) {
                    std::span<float> prev = w.mutable_previous_params(i);
                    for (size_t k = 0; k < prev.size(); ++k)
                      prev[k] = 0.05f * std::sin(static_cast<float>(k + 1) * 0.37f);
                  }
                }
              }
            }
          }
        }
        for (int i = 0; i < model.num_layers(); ++i)
          CHECK(same_bits(stash->params(i), f32->params(i)));
        // every stage keeping an older version holds fewer bytes of weights, measured
        size_t bytes_stash = 0, bytes_f32 = 0;
        int stashing = 0;
        for (int r = 0; r < d; ++r) {
          CHECK_FALSE(f32->worker(r).store().bf16_stash());
          if (!stash->worker(r).store().bf16_stash()) continue;  // one version, or no products
          ++stashing;
          bytes_stash += stash->worker(r).weight_bytes();
          bytes_f32 += f32->worker(r).weight_bytes();
        }
        CHECK(stashing >= 1);
        MESSAGE("weights: " << bytes_stash << " bytes with the bf16 stash, " << bytes_f32
                            << " with f32");
        CHECK(static_cast<double>(bytes_stash) < 0.85 * static_cast<double>(bytes_f32));
      }
    }
  }
  // the rule's preconditions, named
  const Model model = build_model(tiny_model(Arch::gpt, true, 5));
  SerialExecutorOptions o;
  o.mode = Mode::onef1b;
  o.precision = Precision::bf16;
  o.bf16_stash = true;
  auto e =
      SerialExecutor::create(model, *Partition::even(model.num_layers(), 2), clipped_adamw(), o);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("a bf16 stash needs") != std::string::npos);
}

TEST_CASE("bf16 activations kept for the products compute the bits of f32 ones, in smaller slots") {
  if (actorpipe::testing::skip_without_bf16()) return;
  // every mode, GPT and BERT, a block recomputed and one not (its forward again into scratch),
  // two runs and an evaluation: the blocks keep ln1, qkv, the attention output, ln2 and GELU's
  // output in bf16 (the operands their products round to) or in f32
  for (const char* mode_name : {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"}) {
    for (Arch arch : {Arch::gpt, Arch::bert}) {
      CAPTURE(mode_name);
      CAPTURE(static_cast<int>(arch));
      const Mode mode = *parse_mode(mode_name);
      const Model model = build_model(tiny_model(arch, true, 5));
      const int d = 2;
      const Partition p = *Partition::even(model.num_layers(), d);
      const int m = mode == Mode::pipedream ? 1 : d + 1;
      auto make = [&](bool b16) {
        SerialExecutorOptions o = bf16_options(mode, m, d, 2);
        o.bf16_activations = b16;
        o.recompute.assign(static_cast<size_t>(model.num_layers()), false);
        o.recompute[1] = true;
        return create(model, p, o);
      };
      auto kept16 = make(true), kept32 = make(false);
      CHECK(kept16->worker(0).context().bf16_activations());
      CHECK_FALSE(kept32->worker(0).context().bf16_activations());
      const int steps = mode == Mode::pipedream ? 6 : 3;
      const auto batches = tiny_batches(arch, model.options().vocab_size, 2 * steps * m, 9);
      std::span<const Microbatch> all(batches);
      size_t at = 0;
      for (int run = 0; run < 2; ++run) {
        const auto n = static_cast<size_t>(kept16->microbatches_for(steps));
        auto a = kept16->run(steps, all.subspan(at, n));
        auto b = kept32->run(steps, all.subspan(at, n));
        at += n;
        REQUIRE(a.ok());
        REQUIRE(b.ok());
        CHECK(same_bits(*a, *b));
      }
      auto ea = kept16->evaluate(all.subspan(0, 2)), eb = kept32->evaluate(all.subspan(0, 2));
      REQUIRE(ea.ok());
      REQUIRE(eb.ok());
      CHECK(ea->loss == eb->loss);
      for (int i = 0; i < model.num_layers(); ++i)
        CHECK(same_bits(kept16->params(i), kept32->params(i)));
      // stage 1's slots are smaller: it stashes block 2's activations (block 1 is recomputed)
      CHECK(kept16->worker(1).stash_bytes() < kept32->worker(1).stash_bytes());
    }
  }
  // a block's saved activations: 5 of its 15·C floats per token (ln1, qkv, the attention output,
  // ln2, GELU's output; the attention probabilities stay f32) go to bf16
  const Model gpt = build_model(tiny_model(Arch::gpt, true, 5));
  const Layer& block = gpt.layer(1);
  const size_t N = static_cast<size_t>(kB) * kT, C = static_cast<size_t>(gpt.options().width);
  CHECK(block.saved_floats(kB, kT) - block.saved_floats_bf16(kB, kT) == N * C * 5);
  CHECK(block.saved_floats_for(kB, kT, false) == block.saved_floats(kB, kT));
  CHECK(gpt.layer(0).saved_floats_bf16(kB, kT) == gpt.layer(0).saved_floats(kB, kT));
}
