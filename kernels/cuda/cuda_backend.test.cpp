// The backend parity suite (in the style of ggml's test-backend-ops): every op of the
// ComputeBackend interface, forward and backward, on the CUDA backend against the CPU backend,
// and every op run twice on the GPU with the same bits. The products (linear layers, attention)
// are held to per-op tolerances (cuBLAS sums in another order), and so is the loss (CUDA's logf
// against glibc's log); every other op keeps the CPU kernel's order of operations and is held to
// the CPU's bits. Without a usable
// GPU (or a build without CUDA) each GPU case prints "SKIPPED: <reason>", which ctest reports as
// skipped (SKIP_REGULAR_EXPRESSION), never as passed. The error paths run everywhere.
#include "kernels/cuda/cuda_backend.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "kernels/bf16_gemm.hpp"
#include "kernels/check.hpp"
#include "kernels/context.hpp"
#include "kernels/cpu_backend.hpp"
#include "kernels/internal/test_util.hpp"
#include "tests/support/bits.hpp"
#include "tests/support/gpu_skip.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

// One op's inputs and outputs as host vectors; run() copies them to a backend, calls the op
// there and copies every buffer back (outputs included, as accumulating ops read them first).
struct Buffers {
  std::vector<std::vector<float>> host;
};

using Op = std::function<void(ComputeBackend&, std::vector<float*>&)>;

// The buffers after `op` ran on `be` with `in` as every buffer's starting value.
std::vector<std::vector<float>> run(ComputeBackend& be, const std::vector<std::vector<float>>& in,
                                    const Op& op) {
  std::vector<BackendBuffer> dev;
  std::vector<float*> ptr;
  for (const auto& v : in) {
    dev.emplace_back(be, v.size());
    be.to_backend(dev.back().data(), v.data(), v.size());
    ptr.push_back(dev.back().data());
  }
  op(be, ptr);
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < in.size(); ++i) {
    out.emplace_back(in[i].size());
    be.to_host(out.back().data(), dev[i].data(), in[i].size());
  }
  be.reset_scratch();
  return out;
}

struct Tolerance {
  double atol = 0.0, rtol = 0.0;  // both 0: bitwise
};

// Runs `op` on the CPU backend and on the GPU (twice), checks buffers `outputs` against the CPU
// within `tol` and the two GPU runs bitwise.
void parity(const std::string& what, const std::vector<std::vector<float>>& in,
            const std::vector<size_t>& outputs, Tolerance tol, const Op& op,
            Precision precision = Precision::fp32) {
  Context ctx(1);
  auto cpu = make_cpu_backend(ctx);
  auto gpu = make_cuda_backend(0);
  cpu->set_precision(precision);
  gpu->set_precision(precision);
  const auto want = run(*cpu, in, op);
  const auto got = run(*gpu, in, op);
  const auto again = run(*gpu, in, op);
  for (size_t k : outputs) {
    INFO(what, ": buffer ", k);
    CHECK_MESSAGE(bitwise_equal(got[k], again[k]), what, ": buffer ", k,
                  " differs between two GPU runs");
    if (tol.atol == 0.0 && tol.rtol == 0.0)
      CHECK_MESSAGE(bitwise_equal(got[k], want[k]), what, ": buffer ", k, " not bitwise the CPU's");
    else
      check_close(what + " buffer " + std::to_string(k), got[k], to_double(want[k]), tol.atol,
                  tol.rtol);
  }
}

constexpr Tolerance kGemm{1e-5, 1e-4};
constexpr Tolerance kExact{};
constexpr Tolerance kLog{0.0, 3e-7};  // a few units in the last place of a float

}  // namespace

TEST_CASE("make_cuda_backend explains itself where it cannot run") {
  const std::string why = cuda_unavailable_reason();
  if (why.empty()) {
    auto be = make_cuda_backend(0);
    CHECK(be->device() == Device::cuda);
    CHECK(be->name().rfind("cuda:0", 0) == 0);
    // its memory pool is the GPU's, shared with its companions, and reports what is free: an
    // allocation takes from it
    CHECK(be->pool() == "cuda:0");
    Context ctx(1);
    CHECK(be->companion(ctx)->pool() == "cuda:0");
    const auto before = be->available_bytes();
    REQUIRE(before.has_value());
    CHECK(*before > 0);
    {
      BackendBuffer big(*be, size_t{256} << 20);  // 1 GiB
      const auto during = be->available_bytes();
      REQUIRE(during.has_value());
      CHECK(*during + (size_t{1} << 30) <= *before + (size_t{64} << 20));
    }
    CHECK_THROWS_WITH_AS(make_cuda_backend(4096), doctest::Contains("cuda device index 4096"),
                         CheckFailure);
  } else {
    CHECK_THROWS_WITH_AS(make_cuda_backend(0), doctest::Contains(why.c_str()), CheckFailure);
  }
  CHECK_THROWS_AS(make_cuda_backend(-1), CheckFailure);
}

TEST_CASE("the CPU backend is the CPU kernels: memory, scratch and copies") {
  Context ctx(2);
  auto be = make_cpu_backend(ctx);
  CHECK(be->device() == Device::cpu);
  CHECK(be->name() == "cpu (2 threads)");
  CHECK(be->pool() == "host");
  CHECK(be->available_bytes().has_value());  // MemAvailable
  BackendBuffer b(*be, 1000);
  for (size_t i = 0; i < b.size(); ++i) CHECK(b.data()[i] == 0.0f);
  std::vector<float> v(1000, 2.5f), back(1000);
  be->to_backend(b.data(), v.data(), v.size());
  be->to_host(back.data(), b.data(), back.size());
  CHECK(back == v);
  CHECK(&ctx.backend() != be.get());
  CHECK(ctx.backend().device() == Device::cpu);
  CHECK(ctx.host_backend());
}

TEST_CASE("linear layer: forward, backward and its halves") {
  if (skip_without_gpu()) return;
  Rng r(1);
  const int N = 67, C = 48, OC = 80;
  auto inp = random_vec(size_t{N} * C, r), w = random_vec(size_t{OC} * C, r),
       bias = random_vec(OC, r), out = random_vec(size_t{N} * OC, r),
       dout = random_vec(size_t{N} * OC, r), dinp = random_vec(size_t{N} * C, r),
       dw = random_vec(size_t{OC} * C, r), db = random_vec(OC, r);
  parity("matmul_forward", {out, inp, w, bias}, {0}, kGemm,
         [&](ComputeBackend& be, auto& p) { be.matmul_forward(p[0], p[1], p[2], p[3], N, C, OC); });
  parity("matmul_forward (no bias)", {out, inp, w}, {0}, kGemm, [&](ComputeBackend& be, auto& p) {
    be.matmul_forward(p[0], p[1], p[2], nullptr, N, C, OC);
  });
  parity("matmul_backward", {dinp, dw, db, dout, inp, w}, {0, 1, 2}, kGemm,
         [&](ComputeBackend& be, auto& p) {
           be.matmul_backward(p[0], p[1], p[2], p[3], p[4], p[5], N, C, OC);
         });
  parity("matmul_backward (no dinp, no dbias)", {dw, dout, inp, w}, {0}, kGemm,
         [&](ComputeBackend& be, auto& p) {
           be.matmul_backward(nullptr, p[0], nullptr, p[1], p[2], p[3], N, C, OC);
         });
  parity("matmul_backward_input", {dinp, dout, w}, {0}, kGemm, [&](ComputeBackend& be, auto& p) {
    be.matmul_backward_input(p[0], p[1], p[2], N, C, OC);
  });
  parity("matmul_backward_weight", {dw, db, dout, inp}, {0, 1}, kGemm,
         [&](ComputeBackend& be, auto& p) {
           be.matmul_backward_weight(p[0], p[1], p[2], p[3], N, C, OC);
         });
}

TEST_CASE("layernorm and GELU: forward and backward") {
  if (skip_without_gpu()) return;
  Rng r(2);
  const int N = 53, C = 96;
  const size_t NC = size_t{N} * C;
  auto inp = random_vec(NC, r, -3.0f, 3.0f), w = random_vec(C, r), b = random_vec(C, r),
       out = random_vec(NC, r), mean = random_vec(N, r), rstd = random_vec(N, r),
       dout = random_vec(NC, r), dinp = random_vec(NC, r), dw = random_vec(C, r),
       db = random_vec(C, r);
  parity("layernorm_forward", {out, mean, rstd, inp, w, b}, {0, 1, 2}, kExact,
         [&](ComputeBackend& be, auto& p) {
           be.layernorm_forward(p[0], p[1], p[2], p[3], p[4], p[5], N, C);
         });
  // the backward on the CPU's own statistics, so that only the backward is compared
  Context ctx(1);
  auto cpu = make_cpu_backend(ctx);
  cpu->layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N,
                         C);
  parity("layernorm_backward", {dinp, dw, db, dout, inp, w, mean, rstd}, {0, 1, 2}, kExact,
         [&](ComputeBackend& be, auto& p) {
           be.layernorm_backward(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], N, C);
         });
  parity("gelu_forward", {out, inp}, {0}, kExact,
         [&](ComputeBackend& be, auto& p) { be.gelu_forward(p[0], p[1], static_cast<long>(NC)); });
  parity("gelu_backward", {dinp, inp, dout}, {0}, kExact, [&](ComputeBackend& be, auto& p) {
    be.gelu_backward(p[0], p[1], p[2], static_cast<long>(NC));
  });
}

TEST_CASE("attention: causal and with a key padding mask, forward and backward") {
  if (skip_without_gpu()) return;
  Rng r(3);
  const int B = 3, T = 17, C = 24, NH = 4;
  const size_t BTC = size_t{B} * T * C, att_n = size_t{B} * NH * T * T;
  auto qkv = random_vec(3 * BTC, r, -2.0f, 2.0f), out = random_vec(BTC, r),
       att = random_vec(att_n, r), dout = random_vec(BTC, r), dqkv = random_vec(3 * BTC, r),
       scratch = std::vector<float>(att_n, 0.0f);
  // sequence 0 all real, sequence 1 padded after 11 tokens, sequence 2 with no valid key at all
  std::vector<uint8_t> mask(size_t{B} * T, 1);
  for (int t = 11; t < T; ++t) mask[size_t{T} + t] = 0;
  for (int t = 0; t < T; ++t) mask[2 * size_t{T} + t] = 0;
  for (bool causal : {true, false}) {
    const uint8_t* m = causal ? nullptr : mask.data();
    const std::string kind = causal ? " (causal)" : " (key mask)";
    parity("attention_forward" + kind, {out, att, qkv}, {0, 1}, {1e-6, 1e-4},
           [&](ComputeBackend& be, auto& p) {
             be.attention_forward(p[0], p[1], p[2], m, causal, B, T, C, NH);
           });
    Context ctx(1);
    auto cpu = make_cpu_backend(ctx);
    std::vector<float> o(BTC), a(att_n);
    cpu->attention_forward(o.data(), a.data(), qkv.data(), m, causal, B, T, C, NH);
    parity("attention_backward" + kind, {dqkv, scratch, dout, qkv, a}, {0}, {1e-5, 1e-4},
           [&](ComputeBackend& be, auto& p) {
             be.attention_backward(p[0], p[1], p[2], p[3], p[4], B, T, C, NH, causal);
           });
  }
}

TEST_CASE("cross-entropy with ignored rows, and the loss sum") {
  if (skip_without_gpu()) return;
  Rng r(4);
  const int N = 41, V = 300;
  auto logits = random_vec(size_t{N} * V, r, -5.0f, 5.0f), losses = random_vec(N, r),
       probs = random_vec(size_t{N} * V, r), dlogits = random_vec(size_t{N} * V, r);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[static_cast<size_t>(i)] = i % 7 == 3 ? -1 : r.below(V);
  int counts[2] = {0, 0};
  double sums[2] = {0, 0};
  // the softmax bits are the CPU's; the loss takes CUDA's logf where the CPU takes glibc's log,
  // which may differ in the last place (seen on an H200)
  parity("crossentropy_forward (probabilities)", {losses, probs, logits}, {1}, kExact,
         [&](ComputeBackend& be, auto& p) {
           be.crossentropy_forward(p[0], p[1], p[2], targets.data(), N, V);
         });
  parity("crossentropy_forward (losses)", {losses, probs, logits}, {0}, kLog,
         [&](ComputeBackend& be, auto& p) {
           const int k = be.device() == Device::cpu ? 0 : 1;
           counts[k] = be.crossentropy_forward(p[0], p[1], p[2], targets.data(), N, V);
           sums[k] = be.sum_losses(p[0], N);
         });
  CHECK(counts[0] == counts[1]);
  CHECK(sums[1] == doctest::Approx(sums[0]).epsilon(1e-6));
  parity("crossentropy_forward_backward (gradient)", {losses, dlogits, logits}, {1}, kExact,
         [&](ComputeBackend& be, auto& p) {
           be.crossentropy_forward_backward(p[0], p[1], p[2], targets.data(), 0.25f, N, V);
         });
  parity("crossentropy_forward_backward (losses)", {losses, dlogits, logits}, {0}, kLog,
         [&](ComputeBackend& be, auto& p) {
           be.crossentropy_forward_backward(p[0], p[1], p[2], targets.data(), 0.25f, N, V);
         });
  std::vector<int32_t> bad = targets;
  bad[5] = V;
  auto gpu = make_cuda_backend(0);
  BackendBuffer l(*gpu, N), pr(*gpu, size_t{N} * V), lg(*gpu, size_t{N} * V);
  CHECK_THROWS_AS(gpu->crossentropy_forward(l.data(), pr.data(), lg.data(), bad.data(), N, V),
                  CheckFailure);
}

TEST_CASE("embeddings with repeated tokens and segments") {
  if (skip_without_gpu()) return;
  Rng r(5);
  const int B = 4, T = 9, C = 40, V = 11, S = 2;
  std::vector<int32_t> tokens(size_t{B} * T), segments(size_t{B} * T);
  for (auto& t : tokens) t = r.below(V);  // 36 positions over 11 ids: rows repeat
  for (auto& s : segments) s = r.below(S);
  auto wte = random_vec(size_t{V} * C, r), wpe = random_vec(size_t{T} * C, r),
       wse = random_vec(size_t{S} * C, r), out = random_vec(size_t{B} * T * C, r),
       dout = random_vec(size_t{B} * T * C, r);
  parity("encoder_forward", {out, wte, wpe, wse}, {0}, kExact, [&](ComputeBackend& be, auto& p) {
    be.encoder_forward(p[0], tokens.data(), segments.data(), p[1], p[2], p[3], B, T, C);
  });
  parity("encoder_forward (no segments)", {out, wte, wpe}, {0}, kExact,
         [&](ComputeBackend& be, auto& p) {
           be.encoder_forward(p[0], tokens.data(), nullptr, p[1], p[2], nullptr, B, T, C);
         });
  // the CPU sums each row in (b, t) order, as the GPU: the same bits
  parity("encoder_backward", {wte, wpe, wse, dout}, {0, 1, 2}, kExact,
         [&](ComputeBackend& be, auto& p) {
           be.encoder_backward(p[0], p[1], p[2], p[3], tokens.data(), segments.data(), B, T, C);
         });
}

TEST_CASE("element-wise ops and row moves are exact") {
  if (skip_without_gpu()) return;
  Rng r(6);
  const long N = 1000 + 13;
  auto a = random_vec(N, r), b = random_vec(N, r), c = random_vec(N, r);
  parity("residual_forward", {c, a, b}, {0}, kExact,
         [&](ComputeBackend& be, auto& p) { be.residual_forward(p[0], p[1], p[2], N); });
  parity("residual_forward (aliased)", {a, b}, {0}, kExact,
         [&](ComputeBackend& be, auto& p) { be.residual_forward(p[0], p[0], p[1], N); });
  parity("residual_backward", {a, b, c}, {0, 1}, kExact,
         [&](ComputeBackend& be, auto& p) { be.residual_backward(p[0], p[1], p[2], N); });
  parity("accumulate", {a, b}, {0}, kExact,
         [&](ComputeBackend& be, auto& p) { be.accumulate(p[0], p[1], N); });
  parity("fill_zero", {a}, {0}, kExact,
         [&](ComputeBackend& be, auto& p) { be.fill_zero(p[0], N - 3); });
  parity("scale_inplace", {a}, {0}, kExact,
         [&](ComputeBackend& be, auto& p) { be.scale_inplace(p[0], 0.37f, N); });
  parity("copy", {a, b}, {0}, kExact,
         [&](ComputeBackend& be, auto& p) { be.copy(p[0], p[1], static_cast<size_t>(N) - 7); });
  const int C = 13, rows_in = 20;
  auto x = random_vec(size_t{rows_in} * C, r), g = random_vec(size_t{5} * C, r);
  const std::vector<int32_t> rows = {19, 0, 7, 8, 3};
  parity("gather_rows", {g, x}, {0}, kExact,
         [&](ComputeBackend& be, auto& p) { be.gather_rows(p[0], p[1], rows.data(), 5, C); });
  parity("scatter_rows", {x, g}, {0}, kExact,
         [&](ComputeBackend& be, auto& p) { be.scatter_rows(p[0], p[1], rows.data(), 5, C); });
}

TEST_CASE("optimizer updates with every delay correction, xpipe's prediction, the gradient norm") {
  if (skip_without_gpu()) return;
  Rng r(7);
  const size_t n = 4099;
  auto params = random_vec(n, r), grads = random_vec(n, r), m = random_vec(n, r, -0.1f, 0.1f),
       v = random_vec(n, r, 0.0f, 0.1f), delta = random_vec(n, r, -0.01f, 0.01f),
       ms = random_vec(n, r, 0.0f, 0.1f);
  const AdamWParams ap{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
  for (auto kind :
       {DelayCorrectionKind::none, DelayCorrectionKind::nesterov, DelayCorrectionKind::dc}) {
    const std::string name = kind == DelayCorrectionKind::none       ? "none"
                             : kind == DelayCorrectionKind::nesterov ? "nesterov"
                                                                     : "dc";
    parity("adamw_update (" + name + ")", {params, grads, m, v, delta}, {0, 2, 3}, kExact,
           [&](ComputeBackend& be, auto& p) {
             DelayCorrection c;
             c.kind = kind;
             c.lambda = 0.5f;
             c.delta = kind == DelayCorrectionKind::dc ? p[4] : nullptr;
             be.adamw_update(p[0], p[1], p[2], p[3], n, ap, 7, 0.8f, c);
           });
    parity("sgd_update (" + name + ")", {params, grads, m, delta, ms}, {0, 2, 4}, kExact,
           [&](ComputeBackend& be, auto& p) {
             DelayCorrection c;
             c.kind = kind;
             c.lambda = 0.5f;
             c.delta = kind == DelayCorrectionKind::dc ? p[3] : nullptr;
             c.mean_square = kind == DelayCorrectionKind::dc ? p[4] : nullptr;
             c.step = 4;
             be.sgd_update(p[0], p[1], p[2], n, SGDParams{1e-2f, 0.9f, 1e-4f}, 0.8f, c);
           });
  }
  WeightPrediction wp;
  wp.k = 3 * 1e-3f;
  wp.bc1 = 0.52f;
  wp.bc2_sqrt = 0.17f;
  wp.eps = 1e-8f;
  wp.wd = 0.1f;
  auto out = random_vec(n, r);
  parity("xpipe_predict (adamw)", {out, params, m, v}, {0}, kExact,
         [&](ComputeBackend& be, auto& p) { be.xpipe_predict(p[0], p[1], p[2], p[3], n, wp); });
  parity("xpipe_predict (sgd)", {out, params, m}, {0}, kExact,
         [&](ComputeBackend& be, auto& p) { be.xpipe_predict(p[0], p[1], p[2], nullptr, n, wp); });
  double sums[2] = {0, 0};
  parity("grad_sumsq", {grads}, {0}, kExact, [&](ComputeBackend& be, auto& p) {
    sums[be.device() == Device::cpu ? 0 : 1] = be.grad_sumsq(p[0], n);
  });
  CHECK(same_bits(sums[1], sums[0]));
}

// In bf16 both backends round the products' operands the same way (round to nearest even), and the
// products of bf16 values are exact in f32: what differs is only the order of the f32 sums, as in
// fp32. Attention rounds values the two backends computed in f32 in different orders (the
// probabilities, the scores' gradient), so a value near a rounding boundary may round apart:
// its tolerance is wider.
TEST_CASE("bf16 products: the linear layer and attention against the CPU's bf16 kernels") {
  if (skip_without_gpu_or_bf16()) return;
  Rng r(8);
  const int N = 67, C = 48, OC = 80;
  auto inp = random_vec(size_t{N} * C, r), w = random_vec(size_t{OC} * C, r),
       bias = random_vec(OC, r), out = random_vec(size_t{N} * OC, r),
       dout = random_vec(size_t{N} * OC, r), dinp = random_vec(size_t{N} * C, r),
       dw = random_vec(size_t{OC} * C, r), db = random_vec(OC, r);
  const Precision b16 = Precision::bf16;
  parity(
      "bf16 matmul_forward", {out, inp, w, bias}, {0}, kGemm,
      [&](ComputeBackend& be, auto& p) { be.matmul_forward(p[0], p[1], p[2], p[3], N, C, OC); },
      b16);
  parity(
      "bf16 matmul_backward", {dinp, dw, db, dout, inp, w}, {0, 1, 2}, kGemm,
      [&](ComputeBackend& be, auto& p) {
        be.matmul_backward(p[0], p[1], p[2], p[3], p[4], p[5], N, C, OC);
      },
      b16);
  parity(
      "bf16 matmul_backward_input", {dinp, dout, w}, {0}, kGemm,
      [&](ComputeBackend& be, auto& p) { be.matmul_backward_input(p[0], p[1], p[2], N, C, OC); },
      b16);
  parity(
      "bf16 matmul_backward_weight", {dw, db, dout, inp}, {0, 1}, kGemm,
      [&](ComputeBackend& be, auto& p) {
        be.matmul_backward_weight(p[0], p[1], p[2], p[3], N, C, OC);
      },
      b16);
  // fp32 products would be wrong here: the bf16 results differ from them by far more than kGemm
  Context ctx(1);
  auto cpu = make_cpu_backend(ctx);
  std::vector<float> f32_out = out, b16_out = out;
  cpu->matmul_forward(f32_out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  cpu->set_precision(b16);
  cpu->matmul_forward(b16_out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  double worst = 0.0;
  for (size_t i = 0; i < f32_out.size(); ++i)
    worst = std::max(worst, std::fabs(double(f32_out[i]) - double(b16_out[i])));
  CHECK(worst > 1e-3);

  const int B = 3, T = 17, AC = 24, NH = 4;
  const size_t BTC = size_t{B} * T * AC, att_n = size_t{B} * NH * T * T;
  auto qkv = random_vec(3 * BTC, r, -2.0f, 2.0f), aout = random_vec(BTC, r),
       att = random_vec(att_n, r), adout = random_vec(BTC, r), dqkv = random_vec(3 * BTC, r),
       scratch = std::vector<float>(att_n, 0.0f);
  for (bool causal : {true, false}) {
    const std::string kind = causal ? " (causal)" : " (bidirectional)";
    parity(
        "bf16 attention_forward" + kind, {aout, att, qkv}, {0, 1}, {1e-4, 1e-3},
        [&](ComputeBackend& be, auto& p) {
          be.attention_forward(p[0], p[1], p[2], nullptr, causal, B, T, AC, NH);
        },
        b16);
    std::vector<float> o(BTC), a(att_n);
    cpu->attention_forward(o.data(), a.data(), qkv.data(), nullptr, causal, B, T, AC, NH);
    parity(
        "bf16 attention_backward" + kind, {dqkv, scratch, adout, qkv, a}, {0}, {1e-4, 1e-3},
        [&](ComputeBackend& be, auto& p) {
          be.attention_backward(p[0], p[1], p[2], p[3], p[4], B, T, AC, NH, causal);
        },
        b16);
  }
}
