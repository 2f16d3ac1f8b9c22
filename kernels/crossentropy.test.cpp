// Cross-entropy tests: losses and probabilities against a double reference, gradients
// against central differences of the summed loss, ignored rows, the fused path bitwise
// equal to forward + backward, stability for large logits, any thread count.
#include "kernels/crossentropy.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/check.hpp"
#include "kernels/internal/test_util.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

// Per-row loss (0 for ignored rows) and softmax.
std::vector<double> ref_losses(const std::vector<double>& x, const std::vector<int32_t>& tgt, int N,
                               int V, std::vector<double>* probs = nullptr) {
  std::vector<double> loss(static_cast<size_t>(N), 0.0);
  if (probs != nullptr) probs->assign(x.size(), 0.0);
  for (int n = 0; n < N; ++n) {
    const double* row = x.data() + static_cast<size_t>(n) * V;
    double mx = row[0];
    for (int v = 1; v < V; ++v) mx = std::max(mx, row[v]);
    double s = 0.0;
    for (int v = 0; v < V; ++v) s += std::exp(row[v] - mx);
    if (probs != nullptr)
      for (int v = 0; v < V; ++v)
        (*probs)[static_cast<size_t>(n) * V + v] = std::exp(row[v] - mx) / s;
    const int32_t t = tgt[static_cast<size_t>(n)];
    if (t != kIgnoreIndex) loss[static_cast<size_t>(n)] = std::log(s) + mx - row[t];
  }
  return loss;
}

// N·V logits in [-offset, span·1e-3 - offset), from a fixed linear congruential sequence.
std::vector<float> lcg_logits(int N, int V, uint32_t seed, int32_t span, float offset) {
  std::vector<float> logits(static_cast<size_t>(N) * V);
  uint32_t x = seed;
  for (float& v : logits) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(x >> 8) % span) * 1e-3f - offset;
  }
  return logits;
}

}  // namespace

TEST_CASE("cross-entropy forward and backward against double reference and finite differences") {
  const int N = 10, V = 11;  // B=2, T=5
  Rng rng(13);
  Context ctx(2);
  auto logits = random_vec(static_cast<size_t>(N) * V, rng, -3.0f, 3.0f);
  std::vector<int32_t> tgt = {3, kIgnoreIndex, 0, 10, 5, 5, kIgnoreIndex, 1, 9, 2};
  std::vector<float> losses(static_cast<size_t>(N), -7.0f), probs(logits.size(), -7.0f);
  const int count =
      crossentropy_forward(ctx, losses.data(), probs.data(), logits.data(), tgt.data(), N, V);
  CHECK(count == 8);
  CHECK(count_targets(tgt.data(), N) == 8);
  auto xd = to_double(logits);
  std::vector<double> p_ref;
  const auto l_ref = ref_losses(xd, tgt, N, V, &p_ref);
  check_close("losses", losses, l_ref, 1e-6, 1e-6);
  for (int n = 0; n < N; ++n) {
    if (tgt[static_cast<size_t>(n)] == kIgnoreIndex) {
      CHECK(losses[static_cast<size_t>(n)] == 0.0f);
      for (int v = 0; v < V; ++v)
        CHECK(probs[static_cast<size_t>(n) * V + v] == -7.0f);  // untouched
      continue;
    }
    std::vector<float> row(probs.begin() + n * V, probs.begin() + (n + 1) * V);
    std::vector<double> want(p_ref.begin() + n * V, p_ref.begin() + (n + 1) * V);
    check_close("probs", row, want, 1e-7, 1e-6);
  }
  double want_sum = 0.0;
  for (float l : losses) want_sum += static_cast<double>(l);
  CHECK(sum_losses(losses.data(), N) == want_sum);

  // Mean loss: dloss = 1/count; backward overwrites dlogits.
  const float dloss = 1.0f / static_cast<float>(count);
  std::vector<float> dlogits(logits.size(), 99.0f);
  crossentropy_backward(ctx, dlogits.data(), probs.data(), tgt.data(), dloss, N, V);
  auto num = numeric_grad(xd, [&] {
    const auto l = ref_losses(xd, tgt, N, V);
    double s = 0.0;
    for (double v : l) s += v;
    return s / count;
  });
  check_close("dlogits", dlogits, num, 1e-7, 1e-5);

  // Fused forward+backward: bitwise the same as the two calls, also in place.
  std::vector<float> l2(static_cast<size_t>(N)), d2(logits.size());
  CHECK(crossentropy_forward_backward(ctx, l2.data(), d2.data(), logits.data(), tgt.data(), dloss,
                                      N, V) == count);
  CHECK(bitwise_equal(l2, losses));
  CHECK(bitwise_equal(d2, dlogits));
  auto inplace = logits;
  crossentropy_forward_backward(ctx, l2.data(), inplace.data(), inplace.data(), tgt.data(), dloss,
                                N, V);
  CHECK(bitwise_equal(inplace, dlogits));
  // probs aliasing logits, then dlogits aliasing probs.
  auto buf = logits;
  crossentropy_forward(ctx, l2.data(), buf.data(), buf.data(), tgt.data(), N, V);
  CHECK(bitwise_equal(l2, losses));
  crossentropy_backward(ctx, buf.data(), buf.data(), tgt.data(), dloss, N, V);
  CHECK(bitwise_equal(buf, dlogits));
}

TEST_CASE("cross-entropy is stable for large logits and wide rows") {
  const int N = 3, V = 50257;
  Rng rng(14);
  auto logits = random_vec(static_cast<size_t>(N) * V, rng, -5.0f, 5.0f);
  logits[17] = 300.0f;        // row 0: one dominant logit (target)
  logits[V + 100] = -300.0f;  // row 1: a very negative target
  for (int v = 0; v < V; ++v) logits[2 * static_cast<size_t>(V) + v] += 1000.0f;  // row 2: shifted
  std::vector<int32_t> tgt = {17, 100, 4242};
  Context ctx(2);
  std::vector<float> losses(N), probs(logits.size());
  crossentropy_forward(ctx, losses.data(), probs.data(), logits.data(), tgt.data(), N, V);
  const auto want = ref_losses(to_double(logits), tgt, N, V);
  for (float l : losses) CHECK(std::isfinite(l));
  check_close("losses", losses, want, 1e-4, 1e-5);
  double psum = 0.0;
  for (int v = 0; v < V; ++v) psum += probs[2 * static_cast<size_t>(V) + v];
  CHECK(psum == doctest::Approx(1.0).epsilon(1e-5));
}

TEST_CASE("cross-entropy rejects targets outside 0..V-1") {
  Context ctx(1);
  std::vector<float> logits(6, 0.0f), losses(2), d(6);
  std::vector<int32_t> bad = {0, 3};
  CHECK_THROWS_AS(
      crossentropy_forward(ctx, losses.data(), d.data(), logits.data(), bad.data(), 2, 3),
      CheckFailure);
  bad = {-2, 0};
  CHECK_THROWS_AS(crossentropy_forward_backward(ctx, losses.data(), d.data(), logits.data(),
                                                bad.data(), 1.0f, 2, 3),
                  CheckFailure);
}

TEST_CASE("cross-entropy: same bits for 1, 2 and 3 threads") {
  const int N = 37, V = 1001;
  Rng rng(15);
  const auto logits = random_vec(static_cast<size_t>(N) * V, rng, -8.0f, 8.0f);
  std::vector<int32_t> tgt(static_cast<size_t>(N));
  for (auto& t : tgt) t = rng.below(5) == 0 ? kIgnoreIndex : rng.below(V);
  auto run = [&](int threads) {
    Context ctx(threads);
    std::vector<float> losses(static_cast<size_t>(N)), d(logits.size());
    crossentropy_forward_backward(ctx, losses.data(), d.data(), logits.data(), tgt.data(), 0.1f, N,
                                  V);
    d.insert(d.end(), losses.begin(), losses.end());
    return d;
  };
  const auto r1 = run(1);
  CHECK(bitwise_equal(r1, run(1)));
  CHECK(bitwise_equal(r1, run(2)));
  CHECK(bitwise_equal(r1, run(3)));
}

TEST_CASE("crossentropy_forward_backward into bf16: the f32 call's losses and rounded dlogits") {
  constexpr int N = 37, V = 1000;  // V not a multiple of the vector lanes
  const std::vector<float> logits = lcg_logits(N, V, 7, 20000, 0.0f);
  std::vector<int32_t> tgt(N);
  for (int i = 0; i < N; ++i) tgt[i] = i % 5 == 3 ? kIgnoreIndex : (i * 131) % V;
  const float dloss = 1.0f / 29.0f;
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    Context ctx(threads);
    std::vector<float> l32(N), d32(logits.size()), l16(N, -1.0f);
    std::vector<bf16> d16(logits.size(), to_bf16(-1.0f)), want(logits.size());
    const int n32 = crossentropy_forward_backward(ctx, l32.data(), d32.data(), logits.data(),
                                                  tgt.data(), dloss, N, V);
    const int n16 = crossentropy_forward_backward(ctx, l16.data(), d16.data(), logits.data(),
                                                  tgt.data(), dloss, N, V);
    convert_to_bf16(d32.data(), want.data(), static_cast<int64_t>(want.size()));
    CHECK(n16 == n32);
    CHECK(std::memcmp(l16.data(), l32.data(), sizeof(float) * N) == 0);
    CHECK(d16 == want);  // ignored rows included: zeros
    CHECK(d16[static_cast<size_t>(3) * V + 1] == bf16{});
  }
}

TEST_CASE("crossentropy_losses: crossentropy_forward's losses and count, bit for bit") {
  constexpr int N = 41, V = 777;
  const std::vector<float> logits = lcg_logits(N, V, 11, 30000, 10.0f);
  std::vector<int32_t> tgt(N);
  for (int i = 0; i < N; ++i) tgt[i] = i % 7 == 2 ? kIgnoreIndex : (i * 53) % V;
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    Context ctx(threads);
    std::vector<float> want(N), got(N, -1.0f), probs(logits.size());
    const int n =
        crossentropy_forward(ctx, want.data(), probs.data(), logits.data(), tgt.data(), N, V);
    CHECK(crossentropy_losses(ctx, got.data(), logits.data(), tgt.data(), N, V) == n);
    CHECK(std::memcmp(got.data(), want.data(), sizeof(float) * N) == 0);
    CHECK(got[2] == 0.0f);
  }
  std::vector<int32_t> bad(N, 0);
  bad[5] = V;
  Context ctx(1);
  std::vector<float> l(N);
  CHECK_THROWS_AS(crossentropy_losses(ctx, l.data(), logits.data(), bad.data(), N, V),
                  CheckFailure);
}

TEST_CASE("the backward from the forward's stats: crossentropy_forward_backward's bits") {
  constexpr int N = 43, V = 1000;  // V neither a multiple of the lanes nor of the row blocks
  const std::vector<float> logits = lcg_logits(N, V, 13, 40000, 15.0f);
  std::vector<int32_t> tgt(N);
  // targets in the first, a middle and the last block of a row, and ignored rows
  for (int i = 0; i < N; ++i)
    tgt[i] = i % 6 == 1 ? kIgnoreIndex : (i % 3 == 0 ? 0 : (i % 3 == 1 ? V - 1 : (i * 97) % V));
  const float dloss = 1.0f / 31.0f;
  for (int threads : {1, 2, 3}) {
    CAPTURE(threads);
    Context ctx(threads);
    std::vector<float> want_l(N), want_d(logits.size());
    const int n = crossentropy_forward_backward(ctx, want_l.data(), want_d.data(), logits.data(),
                                                tgt.data(), dloss, N, V);
    std::vector<float> l(N, -1.0f), stats(2 * static_cast<size_t>(N), -7.0f);
    CHECK(crossentropy_losses(ctx, l.data(), stats.data(), logits.data(), tgt.data(), N, V) == n);
    CHECK(std::memcmp(l.data(), want_l.data(), sizeof(float) * N) == 0);
    CHECK(stats[2] == -7.0f);  // row 1 is ignored: its stats stay as they were
    std::vector<float> d(logits.size(), -1.0f);
    crossentropy_backward(ctx, d.data(), stats.data(), logits.data(), tgt.data(), dloss, N, V);
    CHECK(std::memcmp(d.data(), want_d.data(), sizeof(float) * d.size()) == 0);
    std::vector<bf16> d16(logits.size(), to_bf16(-1.0f)), want16(logits.size());
    crossentropy_backward(ctx, d16.data(), stats.data(), logits.data(), tgt.data(), dloss, N, V);
    convert_to_bf16(want_d.data(), want16.data(), static_cast<int64_t>(want16.size()));
    CHECK(d16 == want16);  // ignored rows included: zeros
  }
}
