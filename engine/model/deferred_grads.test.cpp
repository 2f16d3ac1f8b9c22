// DeferredGrads tests: recorded weight gradients equal matmul_backward_weight computed at once, in
// the order recorded; copies survive the caller overwriting their source; run() and clear() leave
// it empty and keep the storage for the next backward.
#include "engine/model/deferred_grads.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "kernels/matmul.hpp"
#include "tests/support/bf16_skip.hpp"

using namespace actorpipe;

namespace {

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 7919) % 23) - 1.0f;
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("recorded gradients equal the weight half computed at once, in the order recorded") {
  const int N = 24, C = 16, OC = 12;
  Context ctx(2);
  const auto inp = ramp(static_cast<size_t>(N) * C, 0.125f);
  auto dout = ramp(static_cast<size_t>(N) * OC, 0.25f);
  const auto dout_saved = dout;
  // two tasks on the same buffers: the second adds onto the first's result
  std::vector<float> want_w(static_cast<size_t>(OC) * C, 0.5f), want_b(OC, 0.25f);
  matmul_backward_weight(ctx, want_w.data(), want_b.data(), dout.data(), inp.data(), N, C, OC);
  matmul_backward_weight(ctx, want_w.data(), nullptr, dout.data(), inp.data(), N, C, OC);

  DeferredGrads later;
  CHECK(later.empty());
  std::vector<float> w(static_cast<size_t>(OC) * C, 0.5f), b(OC, 0.25f);
  const float* kept = later.copy(dout.data(), dout.size());
  later.add_linear(w.data(), b.data(), kept, inp.data(), N, C, OC);
  later.add_linear(w.data(), nullptr, kept, inp.data(), N, C, OC);
  CHECK(later.size() == 2);
  std::fill(dout.begin(), dout.end(), 1e30f);      // the caller reuses its buffer
  CHECK(w == std::vector<float>(w.size(), 0.5f));  // nothing computed before run()
  later.run(ctx);
  CHECK(later.empty());
  CHECK(same_bits(w, want_w));
  CHECK(same_bits(b, want_b));

  // the next backward reuses the storage: same requests, no growth
  const size_t capacity = later.capacity_bytes();
  CHECK(capacity >= dout.size() * sizeof(float));
  for (int round = 0; round < 3; ++round) {
    float* held = later.hold(dout_saved.size());
    std::memcpy(held, dout_saved.data(), dout_saved.size() * sizeof(float));
    later.add_linear(w.data(), nullptr, held, inp.data(), N, C, OC);
    later.clear();  // dropped, not computed
    CHECK(later.empty());
  }
  CHECK(later.capacity_bytes() == capacity);
  CHECK(same_bits(w, want_w));
}

TEST_CASE("bf16: the input half rounds dout once and takes dbias, the recorded half the bits") {
  if (actorpipe::testing::skip_without_bf16()) return;
  const int N = 24, C = 16, OC = 40;
  Context ctx(2);
  ctx.set_precision(Precision::bf16);
  const auto inp = ramp(static_cast<size_t>(N) * C, 0.125f);
  auto dout = ramp(static_cast<size_t>(N) * OC, 0.25f);
  const auto weight = ramp(static_cast<size_t>(OC) * C, 0.0625f);
  std::vector<bf16> inp16(inp.size());
  convert_to_bf16(inp.data(), inp16.data(), static_cast<int64_t>(inp.size()));
  for (const bool b16 : {false, true}) {
    CAPTURE(b16);
    std::vector<float> want_i(inp.size(), 0.5f), want_w(static_cast<size_t>(OC) * C, 0.5f),
        want_b(OC, 0.25f);
    if (b16)
      matmul_backward(ctx, want_i.data(), want_w.data(), want_b.data(), dout.data(), inp16.data(),
                      weight.data(), N, C, OC);
    else
      matmul_backward(ctx, want_i.data(), want_w.data(), want_b.data(), dout.data(), inp.data(),
                      weight.data(), N, C, OC);

    DeferredGrads later;
    std::vector<float> di(inp.size(), 0.5f), w(static_cast<size_t>(OC) * C, 0.5f), b(OC, 0.25f);
    bf16* g = later.hold_bf16(dout.size());
    matmul_backward_input(ctx, di.data(), b.data(), g, dout.data(), weight.data(), N, C, OC);
    if (b16)
      later.add_linear(w.data(), g, inp16.data(), N, C, OC);
    else
      later.add_linear(w.data(), g, inp.data(), N, C, OC);
    CHECK(same_bits(di, want_i));  // the input half and the bias are done now
    CHECK(same_bits(b, want_b));
    auto saved = dout;
    std::fill(dout.begin(), dout.end(), 1e30f);  // the caller reuses its f32 buffer
    later.run(ctx);
    dout = saved;
    CHECK(same_bits(w, want_w));
  }
}
