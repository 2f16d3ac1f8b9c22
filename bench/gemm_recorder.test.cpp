// GEMM recorder tests: the pieces of a split product land on the threads that ran them and
// replay to the same bits; a whole training step's recorded FLOPs equal an independent count.
#include "bench/gemm_recorder.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "engine/execution/reference_trainer.hpp"
#include "kernels/gemm.hpp"

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

Microbatch make_microbatch(int V, int B, int T) {
  Microbatch mb;
  mb.B = B;
  mb.T = T;
  for (int i = 0; i < B * T; ++i) {
    mb.tokens.push_back((i * 7 + 3) % V);
    mb.targets.push_back((i * 5 + 1) % V);
  }
  return mb;
}

// A GPT of two blocks, width 64, 4 heads, 96 tokens, a context of 48.
ModelOptions two_block_gpt() {
  ModelOptions mo;
  mo.vocab_size = 96;
  mo.context = 48;
  mo.width = 64;
  mo.depth = 2;
  mo.heads = 4;
  return mo;
}

}  // namespace

TEST_CASE("the program's cblas_sgemm is the recording one") {
  CHECK(sgemm_interposed());
}

TEST_CASE("a split product is recorded piece by piece, per thread, and replays bitwise") {
  const int M = 512, N = 256, K = 256;  // 32M multiply-adds: split over 2 threads
  Context ctx(2);
  const auto A = random_vector(static_cast<size_t>(M) * K, 1);
  const auto B = random_vector(static_cast<size_t>(K) * N, 2);
  std::vector<float> C(static_cast<size_t>(M) * N, 0.0f);
  GemmRecorder rec(ctx);
  rec.start();
  gemm(ctx, false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
  rec.stop();
  CHECK(rec.foreign_calls() == 0);
  REQUIRE(rec.calls().size() == 2);
  // Row pieces [0, m0) and [m0, M), each recorded by the thread that took it (the caller, or
  // the worker; a thread may take both)
  std::vector<SgemmCall> pieces;
  for (const auto& per_thread : rec.calls())
    pieces.insert(pieces.end(), per_thread.begin(), per_thread.end());
  REQUIRE(pieces.size() == 2);
  std::sort(pieces.begin(), pieces.end(),
            [](const SgemmCall& a, const SgemmCall& b) { return a.A < b.A; });
  const SgemmCall& p0 = pieces[0];
  const SgemmCall& p1 = pieces[1];
  CHECK(p0.A == A.data());
  CHECK(p0.C == C.data());
  CHECK(p1.A == A.data() + static_cast<size_t>(p0.M) * K);
  CHECK(p1.C == C.data() + static_cast<size_t>(p0.M) * N);
  CHECK(p0.M + p1.M == M);
  CHECK(p0.N == N);
  CHECK(p1.K == K);
  CHECK(rec.total_flops() == 2.0 * M * N * K);

  // the replay computes the product again, bitwise, into a copy of C: C itself stays untouched
  const std::vector<float> first = C;
  std::fill(C.begin(), C.end(), -7.0f);
  CHECK(rec.replayed(C.data()) == C.data());  // no copy before the first replay
  CHECK(rec.replay() > 0.0);
  CHECK(rec.shadow_bytes() == sizeof(float) * C.size());
  CHECK(std::all_of(C.begin(), C.end(), [](float x) { return x == -7.0f; }));
  const float* copy = rec.replayed(C.data());
  REQUIRE(copy != C.data());
  CHECK(std::equal(first.begin(), first.end(), copy));
  CHECK(rec.replayed(C.data() + 5) == copy + 5);
  CHECK(rec.replayed(A.data()) == A.data());  // operands no call writes are read in place
  rec.replay();
  CHECK(rec.total_calls() == 2);  // replays are not recorded
}

TEST_CASE("each thread's calls are recorded as that thread's, in its order") {
  const int M = 32, N = 16, K = 8;
  Context ctx(2);
  const auto A = random_vector(static_cast<size_t>(M) * K, 6);
  const auto B = random_vector(static_cast<size_t>(K) * N, 7);
  std::vector<float> C(static_cast<size_t>(4) * M * N, 0.0f);
  GemmRecorder rec(ctx);
  rec.start();
  // chunk c (the static partition: one per thread) makes products c and c + 2
  ctx.parallel_for(2, [&](int c, int64_t, int64_t) {
    for (int k : {c, c + 2})
      gemm_serial(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f,
                  C.data() + static_cast<size_t>(k) * M * N, N);
  });
  rec.stop();
  REQUIRE(rec.calls().size() == 2);
  for (size_t c = 0; c < 2; ++c) {
    REQUIRE(rec.calls()[c].size() == 2);
    CHECK(rec.calls()[c][0].C == C.data() + c * M * N);
    CHECK(rec.calls()[c][1].C == C.data() + (c + 2) * M * N);
  }
}

TEST_CASE("a product reading what an earlier one wrote reads it from the copy") {
  const int M = 64, N = 48, K = 32;
  Context ctx(1);
  const auto A = random_vector(static_cast<size_t>(M) * K, 3);
  const auto B = random_vector(static_cast<size_t>(K) * N, 4);
  const auto B2 = random_vector(static_cast<size_t>(N) * N, 5);
  std::vector<float> C1(static_cast<size_t>(M) * N, 0.0f);
  std::vector<float> C2(static_cast<size_t>(M) * N, 0.0f);
  GemmRecorder rec(ctx);
  rec.start();
  gemm(ctx, false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C1.data(), N);
  gemm(ctx, false, false, M, N, N, 1.0f, C1.data(), N, B2.data(), N, 0.0f, C2.data(), N);
  rec.stop();
  const std::vector<float> first1 = C1, first2 = C2;
  std::fill(C1.begin(), C1.end(), 0.0f);  // the replay would read these zeros in place
  rec.replay();
  CHECK(std::equal(first1.begin(), first1.end(), rec.replayed(C1.data())));
  CHECK(std::equal(first2.begin(), first2.end(), rec.replayed(C2.data())));
  CHECK(std::equal(first2.begin(), first2.end(), C2.begin()));  // C2 as the step left it
  REQUIRE(rec.calls()[0].size() == 2);
}

TEST_CASE("a training step's sgemm FLOPs equal the model's matmul and attention FLOPs") {
  // T <= 64: the causal attention's blocked GEMMs then cover the whole T×T square once.
  const ModelOptions mo = two_block_gpt();
  const int B = 3, T = 48, C = mo.width, L = mo.depth, V = mo.vocab_size;
  const double tokens = static_cast<double>(B) * T;
  // Forward 2·(12C² per block + V·C head) per token, backward twice that (input and weight
  // gradients); attention: QKᵀ and A·V forward, four products backward, 2·T·C each.
  const double expect =
      3.0 * 2.0 * tokens * (L * 12.0 * C * C + 1.0 * V * C) + L * 12.0 * tokens * T * C;
  const std::vector<Microbatch> mbs = {make_microbatch(V, B, T)};
  double flops_1 = 0.0;
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    auto model = Model::build(mo);
    REQUIRE(model.ok());
    ReferenceTrainer trainer(std::move(*model), OptimizerOptions{}, B, T, threads);
    trainer.step(mbs);
    GemmRecorder rec(trainer.context());
    rec.start();
    trainer.step(mbs);
    rec.stop();
    CHECK(rec.foreign_calls() == 0);
    CHECK(rec.total_flops() == doctest::Approx(expect).epsilon(1e-12));
    if (threads == 1) flops_1 = rec.total_flops();
    if (threads == 2) CHECK(rec.total_flops() == flops_1);
    CHECK(rec.replay() > 0.0);
  }
}

TEST_CASE("replays between steps leave the training as it would have gone without them") {
  const ModelOptions mo = two_block_gpt();
  const int B = 2, T = 32;
  const std::vector<Microbatch> mbs = {make_microbatch(mo.vocab_size, B, T)};
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    auto m1 = Model::build(mo);
    auto m2 = Model::build(mo);
    REQUIRE(m1.ok());
    REQUIRE(m2.ok());
    ReferenceTrainer plain(std::move(*m1), OptimizerOptions{}, B, T, threads);
    ReferenceTrainer replayed(std::move(*m2), OptimizerOptions{}, B, T, threads);
    GemmRecorder rec(replayed.context());
    rec.start();
    replayed.step(mbs);
    rec.stop();
    plain.step(mbs);
    for (int i = 0; i < 3; ++i) {
      rec.replay();  // between two steps, as the bench times them
      const double a = plain.step(mbs);
      const double b = replayed.step(mbs);
      CHECK(a == b);
    }
    CHECK(rec.shadow_bytes() > 0);
  }
}
