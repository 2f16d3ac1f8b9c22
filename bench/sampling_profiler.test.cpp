// Profiler tests: names, files and libraries map to the documented categories; the program's
// own symbols resolve; a thread busy in one kernel is sampled in that kernel's category.
#include "bench/sampling_profiler.hpp"

#include <dlfcn.h>
#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <vector>

#include "kernels/gemm.hpp"
#include "kernels/layernorm.hpp"

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {

using Clock = std::chrono::steady_clock;

// Samples `fn` run repeatedly for about `ms` milliseconds on this thread.
ProfileReport profile_loop(Context& ctx, double ms, const auto& fn) {
  SamplingProfiler prof(100000);
  Symbolizer sym;
  const auto period = std::chrono::microseconds(500);
  REQUIRE(prof.start(period));
  const auto t0 = Clock::now();
  double wall = 0.0;
  while (wall < ms) {
    fn(ctx);
    wall = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  prof.stop();
  return summarize_profile(prof, sym, 1, wall, period);
}

double caller_share(const ProfileReport& r, KernelCategory c) {
  double total = 0.0;
  for (const auto& row : r.rows) total += row.caller_ms;
  return r.rows.at(static_cast<size_t>(c)).caller_ms / total;
}

}  // namespace

TEST_CASE("classify: libraries, source files of local symbols, then names") {
  CHECK(classify({}, {}, "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3") ==
        KernelCategory::gemm);
  CHECK(classify({}, {}, "/lib/x86_64-linux-gnu/libc.so.6") == KernelCategory::libc);
  CHECK(classify({}, {}, "/usr/lib/x86_64-linux-gnu/libstdc++.so.6") == KernelCategory::libc);
  CHECK(classify({}, {}, "/usr/lib/libucs.so.0") == KernelCategory::other);
  CHECK(classify("actorpipe::(anonymous namespace)::softmax_row(float*, unsigned char const*, "
                 "int, int)",
                 "attention.cpp", {}) == KernelCategory::attention);
  CHECK(classify("actorpipe::(anonymous namespace)::row(float*)", "matmul.cpp", {}) ==
        KernelCategory::bias);
  CHECK(classify("actorpipe::layernorm_backward(actorpipe::Context&, float*)", {}, {}) ==
        KernelCategory::layernorm);
  CHECK(classify("actorpipe::ChunkFn::ChunkFn<actorpipe::gelu_forward(actorpipe::Context&, "
                 "float*, float const*, long)::{lambda(int, long, long)#1}>(...)::"
                 "{lambda(void*, int, long, long)#1}::_FUN(void*, int, long, long)",
                 {}, {}) == KernelCategory::gelu);
  CHECK(classify("actorpipe::TaskFn::TaskFn<actorpipe::attention_forward_bf16(actorpipe::"
                 "Context&, float*)::{lambda(int, long)#1}>(...)::{lambda(void*, int, long)#1}::"
                 "_FUN(void*, int, long)",
                 {}, {}) == KernelCategory::attention);
  CHECK(classify("actorpipe::Context::run_tasks(long, actorpipe::TaskFn)", {}, {}) ==
        KernelCategory::threads);
  CHECK(short_name("actorpipe::TaskFn::TaskFn<actorpipe::attention_backward(actorpipe::Context&)"
                   "::{lambda(int, long)#1}>(...)") ==
        "actorpipe::attention_backward (parallel task)");
  CHECK(short_name("actorpipe::ChunkFn::ChunkFn<actorpipe::gelu_forward(actorpipe::Context&)::"
                   "{lambda(int, long, long)#1}>(...)") ==
        "actorpipe::gelu_forward (parallel chunk)");
  CHECK(classify("actorpipe::ThreadPool::worker_loop(int)", {}, {}) == KernelCategory::threads);
  CHECK(classify("actorpipe::Context::run_chunks(long, long, actorpipe::ChunkFn)", {}, {}) ==
        KernelCategory::threads);
  CHECK(classify("actorpipe::adamw_update(actorpipe::Context&, float*)", {}, {}) ==
        KernelCategory::optimizer);
  CHECK(classify("actorpipe::Model::grad_sumsq(actorpipe::Context&, int, float const*) const", {},
                 {}) == KernelCategory::optimizer);
  CHECK(classify("actorpipe::crossentropy_forward_backward(...)", {}, {}) ==
        KernelCategory::crossentropy);
  CHECK(classify("actorpipe::encoder_backward(...)", {}, {}) == KernelCategory::embedding);
  CHECK(classify("actorpipe::residual_forward(...)", {}, {}) == KernelCategory::elementwise);
  CHECK(classify("actorpipe::(anonymous namespace)::to_bf16_loop(float const*, ...)", "bf16.cpp",
                 {}) == KernelCategory::convert);
  CHECK(classify({}, {}, "/lib/x86_64-linux-gnu/libdnnl.so.2") == KernelCategory::gemm);
  CHECK(classify("actorpipe::ReferenceTrainer::forward(actorpipe::Microbatch const&)",
                 "reference_trainer.cpp", {}) == KernelCategory::other);
  for (int c = 0; c < kNumKernelCategories; ++c)
    CHECK(!to_string(static_cast<KernelCategory>(c)).empty());
}

TEST_CASE("the program's functions and OpenBLAS's resolve") {
  Symbolizer sym;
  REQUIRE(sym.has_program_symbols());
  void (*f32_forward)(Context&, float*, float*, float*, const float*, const float*, const float*,
                      int, int) = &layernorm_forward;
  const auto ln = reinterpret_cast<uintptr_t>(f32_forward);
  const ResolvedSymbol& r = sym.resolve(ln);
  CHECK(r.name.find("actorpipe::layernorm_forward(") == 0);
  CHECK(r.category == KernelCategory::layernorm);
  CHECK(&sym.resolve(ln + 1) == &r);  // inside the same function
  void* blas = dlsym(RTLD_NEXT, "cblas_sgemm");
  REQUIRE(blas != nullptr);
  CHECK(sym.resolve(reinterpret_cast<uintptr_t>(blas)).category == KernelCategory::gemm);
}

TEST_CASE("code generated at run time (oneDNN's kernels) counts as gemm, data as other") {
  Symbolizer sym;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* code = mmap(nullptr, page, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* data = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(code != MAP_FAILED);
  REQUIRE(data != MAP_FAILED);
  const ResolvedSymbol& jit = sym.resolve(reinterpret_cast<uintptr_t>(code) + 16);
  CHECK(jit.category == KernelCategory::gemm);
  CHECK(jit.name.find("JIT") != std::string::npos);
  CHECK(sym.resolve(reinterpret_cast<uintptr_t>(data) + 16).category == KernelCategory::other);
  munmap(code, page);
  munmap(data, page);
}

TEST_CASE("a thread busy in one kernel is sampled in that kernel's category") {
  Context ctx(1);
  const int N = 256, C = 768;
  std::vector<float> x(static_cast<size_t>(N) * C, 0.5f), y(x.size()), w(C, 1.0f), b(C, 0.0f),
      mean(N), rstd(N);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97) * 0.01f;
  const ProfileReport ln = profile_loop(ctx, 300.0, [&](Context& c) {
    layernorm_forward(c, y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  });
  CHECK(ln.samples >= 100);
  CHECK(ln.dropped == 0);
  CHECK(caller_share(ln, KernelCategory::layernorm) > 0.8);

  std::vector<float> a(256 * 256, 0.01f), m(256 * 256, 0.02f), out(256 * 256);
  const ProfileReport gm = profile_loop(ctx, 300.0, [&](Context& c) {
    gemm(c, false, false, 256, 256, 256, 1.0f, a.data(), 256, m.data(), 256, 0.0f, out.data(), 256);
  });
  CHECK(gm.samples >= 100);
  CHECK(caller_share(gm, KernelCategory::gemm) > 0.8);
  REQUIRE(!gm.hottest.empty());
  CHECK(gm.hottest[0].category == KernelCategory::gemm);
}
