// Per-kernel timing on transformer shapes: each kernel's time next to the time of the sgemm
// calls it makes, to see where the non-GEMM overhead of a training step goes.
// Usage: kernel_timing [threads] [B T C NH V L] [cpu]  (defaults: 1, 8 256 384 6 8192 6)
// With "cpu", times are process CPU time instead of wall time: steadier on a busy machine
// for one thread (with more threads it includes the workers' spinning).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/bf16.hpp"
#include "kernels/blas_core.hpp"
#include "kernels/context.hpp"
#include "kernels/crossentropy.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/encoder.hpp"
#include "kernels/gelu.hpp"
#include "kernels/gemm.hpp"
#include "kernels/layernorm.hpp"
#include "kernels/matmul.hpp"
#include "kernels/optimizer.hpp"

using namespace actorpipe;

namespace {

bool g_cpu_time = false;

double now_ms() {
  if (g_cpu_time) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double time_ms(const std::function<void()>& fn, int reps) {
  fn();  // warm-up
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double a = now_ms();
    fn();
    t.push_back(now_ms() - a);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<float> buf(size_t n, float v = 0.01f) {
  std::vector<float> b(n);
  uint32_t s = 12345;
  for (auto& x : b) {
    s = s * 1664525u + 1013904223u;
    x = v * (static_cast<float>(s >> 8) / 16777216.0f - 0.5f);
  }
  return b;
}

struct Row {
  std::string name;
  double ms;       // kernel
  double gemm_ms;  // its sgemm calls alone (0 if none)
  int per_step;    // occurrences per training step
};

}  // namespace

int main(int argc, char** argv) {
  // the sgemm columns on the kernels that fit this CPU (kernels/blas_core.hpp)
  const std::string blas = use_fitting_blas_core();
  if (!blas.empty()) std::printf("%s\n", blas.c_str());
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  int B = 8, T = 256, C = 384, NH = 6, V = 8192, L = 6;
  if (argc > 7) {
    B = std::atoi(argv[2]);
    T = std::atoi(argv[3]);
    C = std::atoi(argv[4]);
    NH = std::atoi(argv[5]);
    V = std::atoi(argv[6]);
    L = std::atoi(argv[7]);
  }
  g_cpu_time = std::string(argv[argc - 1]) == "cpu";
  const int N = B * T;
  const int reps = 5;
  Context ctx(threads);
  std::printf("threads=%d B=%d T=%d C=%d NH=%d V=%d L=%d (%s time)\n", threads, B, T, C, NH, V, L,
              g_cpu_time ? "cpu" : "wall");

  auto x = buf(static_cast<size_t>(N) * C), y = buf(static_cast<size_t>(N) * C),
       dx = buf(static_cast<size_t>(N) * C), dy = buf(static_cast<size_t>(N) * C);
  auto qkv = buf(static_cast<size_t>(N) * 3 * C, 2.0f), dqkv = buf(qkv.size());
  auto h4 = buf(static_cast<size_t>(N) * 4 * C), g4 = buf(h4.size()), dh4 = buf(h4.size());
  auto att = buf(static_cast<size_t>(B) * NH * T * T), scratch = buf(att.size());
  auto wqkv = buf(static_cast<size_t>(3) * C * C), dwqkv = buf(wqkv.size());
  auto wfc = buf(static_cast<size_t>(4) * C * C), dwfc = buf(wfc.size());
  auto bias = buf(static_cast<size_t>(4) * C), dbias = buf(bias.size());
  auto lnw = buf(static_cast<size_t>(C), 1.0f), lnb = buf(static_cast<size_t>(C));
  auto dlnw = buf(static_cast<size_t>(C)), dlnb = buf(static_cast<size_t>(C));
  auto mean = buf(static_cast<size_t>(N)), rstd = buf(static_cast<size_t>(N), 1.0f);
  auto wte = buf(static_cast<size_t>(V) * C), dwte = buf(wte.size());
  auto wpe = buf(static_cast<size_t>(T) * C), dwpe = buf(wpe.size());
  auto logits = buf(static_cast<size_t>(N) * V, 10.0f), losses = buf(static_cast<size_t>(N));
  std::vector<int32_t> tokens(static_cast<size_t>(N)), targets(static_cast<size_t>(N));
  for (int i = 0; i < N; ++i) {
    tokens[static_cast<size_t>(i)] = (i * 7919) % V;
    targets[static_cast<size_t>(i)] = (i * 104729) % V;
  }
  const int hs = C / NH, C3 = 3 * C;

  std::vector<Row> rows;
  auto linear = [&](const char* name, int OC, int IC, float* in, float* out, float* din) {
    rows.push_back(
        {std::string(name) + " fwd",
         time_ms([&] { matmul_forward(ctx, out, in, wfc.data(), bias.data(), N, IC, OC); }, reps),
         time_ms(
             [&] {
               gemm(ctx, false, true, N, OC, IC, 1.0f, in, IC, wfc.data(), IC, 1.0f, out, OC);
             },
             reps),
         1});
    rows.push_back(
        {std::string(name) + " bwd",
         time_ms(
             [&] {
               matmul_backward(ctx, din, dwfc.data(), dbias.data(), out, in, wfc.data(), N, IC, OC);
             },
             reps),
         time_ms(
             [&] {
               gemm(ctx, false, false, N, IC, OC, 1.0f, out, OC, wfc.data(), IC, 1.0f, din, IC);
               gemm(ctx, true, false, OC, IC, N, 1.0f, out, OC, in, IC, 1.0f, dwfc.data(), IC);
             },
             reps),
         1});
  };
  rows.push_back({"layernorm fwd",
                  time_ms(
                      [&] {
                        layernorm_forward(ctx, y.data(), mean.data(), rstd.data(), x.data(),
                                          lnw.data(), lnb.data(), N, C);
                      },
                      reps),
                  0, 2});
  rows.push_back({"layernorm bwd",
                  time_ms(
                      [&] {
                        layernorm_backward(ctx, dx.data(), dlnw.data(), dlnb.data(), dy.data(),
                                           x.data(), lnw.data(), mean.data(), rstd.data(), N, C);
                      },
                      reps),
                  0, 2});
  linear("qkv", 3 * C, C, x.data(), qkv.data(), dx.data());
  // Attention and the sgemm calls it makes (same shapes, causal blocks of 64).
  auto att_gemms_fwd = [&] {
    ctx.parallel_for(static_cast<int64_t>(B) * NH, [&](int, int64_t i0, int64_t i1) {
      for (int64_t bh = i0; bh < i1; ++bh) {
        const float* q = qkv.data() + (bh / NH) * T * C3 + (bh % NH) * hs;
        float* A = att.data() + bh * T * T;
        for (int r0 = 0; r0 < T; r0 += 64) {
          const int r1 = std::min(T, r0 + 64);
          gemm_serial(false, true, r1 - r0, r1, hs, 1.0f, q + r0 * C3, C3, q + C, C3, 0.0f,
                      A + r0 * T, T);
          gemm_serial(false, false, r1 - r0, hs, r1, 1.0f, A + r0 * T, T, q + 2 * C, C3, 0.0f,
                      y.data() + (bh / NH) * T * C + (bh % NH) * hs + r0 * C, C);
        }
      }
    });
  };
  auto att_gemms_bwd = [&] {
    ctx.parallel_for(static_cast<int64_t>(B) * NH, [&](int chunk, int64_t i0, int64_t i1) {
      float* D = scratch.data() + static_cast<int64_t>(chunk) * T * T;
      for (int64_t bh = i0; bh < i1; ++bh) {
        const float* q = qkv.data() + (bh / NH) * T * C3 + (bh % NH) * hs;
        float* dq = dqkv.data() + (bh / NH) * T * C3 + (bh % NH) * hs;
        const float* go = dy.data() + (bh / NH) * T * C + (bh % NH) * hs;
        const float* A = att.data() + bh * T * T;
        for (int r0 = 0; r0 < T; r0 += 64) {
          const int r1 = std::min(T, r0 + 64);
          gemm_serial(false, true, r1 - r0, r1, hs, 1.0f, go + r0 * C, C, q + 2 * C, C3, 0.0f,
                      D + r0 * T, T);
          gemm_serial(true, false, r1 - r0, hs, T - r0, 1.0f, A + r0 * T + r0, T, go + r0 * C, C,
                      1.0f, dq + 2 * C + r0 * C3, C3);
          gemm_serial(false, false, r1 - r0, hs, r1, 1.0f, D + r0 * T, T, q + C, C3, 1.0f,
                      dq + r0 * C3, C3);
          gemm_serial(true, false, r1 - r0, hs, T - r0, 1.0f, D + r0 * T + r0, T, q + r0 * C3, C3,
                      1.0f, dq + C + r0 * C3, C3);
        }
      }
    });
  };
  rows.push_back({"attention fwd",
                  time_ms(
                      [&] {
                        attention_forward(ctx, y.data(), att.data(), qkv.data(), nullptr, true, B,
                                          T, C, NH);
                      },
                      reps),
                  time_ms(att_gemms_fwd, reps), 1});
  rows.push_back({"attention bwd",
                  time_ms(
                      [&] {
                        attention_backward(ctx, dqkv.data(), scratch.data(), dy.data(), qkv.data(),
                                           att.data(), B, T, C, NH, true);
                      },
                      reps),
                  time_ms(att_gemms_bwd, reps), 1});
  linear("attn proj", C, C, x.data(), y.data(), dx.data());
  rows.push_back(
      {"residual fwd",
       time_ms(
           [&] { residual_forward(ctx, y.data(), x.data(), dx.data(), static_cast<long>(N) * C); },
           reps),
       0, 2});
  rows.push_back({"residual bwd",
                  time_ms(
                      [&] {
                        residual_backward(ctx, dx.data(), y.data(), dy.data(),
                                          static_cast<long>(N) * C);
                      },
                      reps),
                  0, 2});
  rows.push_back({"zero grads",
                  time_ms([&] { fill_zero(ctx, dh4.data(), static_cast<long>(N) * 4 * C); }, reps),
                  0, 1});
  linear("fc", 4 * C, C, x.data(), h4.data(), dx.data());
  rows.push_back(
      {"gelu fwd",
       time_ms([&] { gelu_forward(ctx, g4.data(), h4.data(), static_cast<long>(N) * 4 * C); },
               reps),
       0, 1});
  rows.push_back({"gelu bwd",
                  time_ms(
                      [&] {
                        gelu_backward(ctx, dh4.data(), h4.data(), g4.data(),
                                      static_cast<long>(N) * 4 * C);
                      },
                      reps),
                  0, 1});
  linear("fc proj", C, 4 * C, g4.data(), y.data(), dh4.data());

  double layer_k = 0, layer_g = 0;
  std::printf("%-16s %9s %9s %9s\n", "kernel", "ms", "sgemm ms", "overhead");
  for (const Row& r : rows) {
    std::printf("%-16s %9.3f %9.3f %9.3f\n", r.name.c_str(), r.ms, r.gemm_ms, r.ms - r.gemm_ms);
    layer_k += r.ms * r.per_step;
    layer_g += r.gemm_ms * r.per_step;
  }
  std::printf("per layer: kernels %.2f ms, sgemm %.2f ms, ratio %.3f\n", layer_k, layer_g,
              layer_k / layer_g);

  // Once per step: embedding, final layernorm, tied LM head, cross-entropy, optimizer.
  std::vector<Row> once;
  once.push_back({"encoder fwd",
                  time_ms(
                      [&] {
                        encoder_forward(ctx, x.data(), tokens.data(), nullptr, wte.data(),
                                        wpe.data(), nullptr, B, T, C);
                      },
                      reps),
                  0, 1});
  once.push_back({"encoder bwd",
                  time_ms(
                      [&] {
                        encoder_backward(ctx, dwte.data(), dwpe.data(), nullptr, dx.data(),
                                         tokens.data(), nullptr, B, T, C);
                      },
                      reps),
                  0, 1});
  once.push_back(
      {"lm head fwd",
       time_ms([&] { matmul_forward(ctx, logits.data(), x.data(), wte.data(), nullptr, N, C, V); },
               reps),
       time_ms(
           [&] {
             gemm(ctx, false, true, N, V, C, 1.0f, x.data(), C, wte.data(), C, 0.0f, logits.data(),
                  V);
           },
           reps),
       1});
  auto logits0 = logits;
  once.push_back(
      {"crossentropy",
       time_ms(
           [&] {
             std::copy(logits0.begin(), logits0.end(), logits.begin());
             crossentropy_forward_backward(ctx, losses.data(), logits.data(), logits.data(),
                                           targets.data(), 1.0f / N, N, V);
           },
           reps) -
           time_ms([&] { std::copy(logits0.begin(), logits0.end(), logits.begin()); }, reps),
       0, 1});
  // the forward's loss: with the probabilities written (the backend op) or alone (the host)
  std::vector<float> probs(logits.size());
  once.push_back({"ce fwd, probs",
                  time_ms(
                      [&] {
                        (void)crossentropy_forward(ctx, losses.data(), probs.data(), logits0.data(),
                                                   targets.data(), N, V);
                      },
                      reps),
                  0, 0});
  once.push_back({"ce fwd, losses",
                  time_ms(
                      [&] {
                        (void)crossentropy_losses(ctx, losses.data(), logits0.data(),
                                                  targets.data(), N, V);
                      },
                      reps),
                  0, 0});
  // bf16: the LM head products' operand, from f32 dlogits rounded in a pass of their own, or
  // rounded by the loss's backward as it makes each row
  std::vector<float> dlogits(logits.size());
  std::vector<bf16> dlogits16(logits.size());
  once.push_back({"ce+round (bf16)",
                  time_ms(
                      [&] {
                        crossentropy_forward_backward(ctx, losses.data(), dlogits.data(),
                                                      logits0.data(), targets.data(), 1.0f / N, N,
                                                      V);
                        convert_to_bf16(ctx, dlogits.data(), dlogits16.data(),
                                        static_cast<int64_t>(dlogits.size()));
                      },
                      reps),
                  0, 0});
  once.push_back({"ce->bf16 (bf16)",
                  time_ms(
                      [&] {
                        crossentropy_forward_backward(ctx, losses.data(), dlogits16.data(),
                                                      logits0.data(), targets.data(), 1.0f / N, N,
                                                      V);
                        ctx.arena().reset();
                      },
                      reps),
                  0, 0});
  // the backward from the forward's row statistics (the GPT head on the host)
  std::vector<float> stats(2 * static_cast<size_t>(N));
  (void)crossentropy_losses(ctx, losses.data(), stats.data(), logits0.data(), targets.data(), N, V);
  once.push_back({"ce bwd, stats",
                  time_ms(
                      [&] {
                        crossentropy_backward(ctx, dlogits.data(), stats.data(), logits0.data(),
                                              targets.data(), 1.0f / N, N, V);
                      },
                      reps),
                  0, 0});
  once.push_back({"ce bwd, stats (bf16)",
                  time_ms(
                      [&] {
                        crossentropy_backward(ctx, dlogits16.data(), stats.data(), logits0.data(),
                                              targets.data(), 1.0f / N, N, V);
                      },
                      reps),
                  0, 0});
  once.push_back({"lm head bwd",
                  time_ms(
                      [&] {
                        matmul_backward(ctx, dx.data(), dwte.data(), nullptr, logits.data(),
                                        x.data(), wte.data(), N, C, V);
                      },
                      reps),
                  time_ms(
                      [&] {
                        gemm(ctx, false, false, N, C, V, 1.0f, logits.data(), V, wte.data(), C,
                             1.0f, dx.data(), C);
                        gemm(ctx, true, false, V, C, N, 1.0f, logits.data(), V, x.data(), C, 1.0f,
                             dwte.data(), C);
                      },
                      reps),
                  1});
  const size_t P =
      static_cast<size_t>(V) * C + static_cast<size_t>(T) * C +
      static_cast<size_t>(L) * (12 * static_cast<size_t>(C) * C + 13 * static_cast<size_t>(C));
  auto p = buf(P), g = buf(P), m = buf(P), v = buf(P, 0.0f);
  for (auto& e : v) e = 1e-4f;
  once.push_back({"grad_sumsq", time_ms([&] { (void)grad_sumsq(ctx, g.data(), P); }, reps), 0, 1});
  once.push_back(
      {"adamw",
       time_ms(
           [&] { adamw_update(ctx, p.data(), g.data(), m.data(), v.data(), P, AdamWParams{}, 10); },
           reps),
       0, 1});
  double once_k = 0, once_g = 0;
  for (const Row& r : once) {
    std::printf("%-16s %9.3f %9.3f %9.3f\n", r.name.c_str(), r.ms, r.gemm_ms, r.ms - r.gemm_ms);
    once_k += r.ms * r.per_step;  // the bf16 rows (0) are not part of the fp32 step
    once_g += r.gemm_ms * r.per_step;
  }
  const double step_k = L * layer_k + once_k, step_g = L * layer_g + once_g;
  std::printf("step estimate (%d layers, %zu params): kernels %.1f ms, sgemm %.1f ms, ratio %.3f\n",
              L, P, step_k, step_g, step_k / step_g);
  return 0;
}
