// CheckedBackend: the CPU backend's bits on memory of its own; host pointers, overruns and index
// arrays in backend memory refused by name; the memory closed between ops.
#include "kernels/checked_backend.hpp"

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/check.hpp"
#include "kernels/context.hpp"
#include "kernels/cpu_backend.hpp"

using namespace actorpipe;

namespace {

std::vector<float> pattern(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 37 + 11) % 17) - 4.0f;
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("ops on its memory compute the CPU backend's bits, transfers round-trip") {
  Context ctx(1);
  CheckedBackend dev(ctx);
  auto cpu = make_cpu_backend(ctx);
  const int N = 6, C = 8, OC = 5;
  const auto inp = pattern(N * C, 0.25f), w = pattern(OC * C, 0.125f), b = pattern(OC, 0.5f);
  const auto gamma = pattern(C, 0.0625f), beta = pattern(C, 0.03125f);
  // the CPU backend on host memory
  std::vector<float> out_cpu(N * OC), ln_cpu(N * C), mean_cpu(N), rstd_cpu(N);
  cpu->matmul_forward(out_cpu.data(), inp.data(), w.data(), b.data(), N, C, OC);
  cpu->layernorm_forward(ln_cpu.data(), mean_cpu.data(), rstd_cpu.data(), inp.data(), gamma.data(),
                         beta.data(), N, C);
  // the same on the checked backend's memory
  BackendBuffer d_inp(dev, inp.size()), d_w(dev, w.size()), d_b(dev, b.size());
  BackendBuffer d_gamma(dev, C), d_beta(dev, C);
  BackendBuffer d_out(dev, out_cpu.size()), d_ln(dev, ln_cpu.size()), d_mean(dev, N),
      d_rstd(dev, N);
  dev.to_backend(d_inp.data(), inp.data(), inp.size());
  dev.to_backend(d_w.data(), w.data(), w.size());
  dev.to_backend(d_b.data(), b.data(), b.size());
  dev.to_backend(d_gamma.data(), gamma.data(), C);
  dev.to_backend(d_beta.data(), beta.data(), C);
  dev.matmul_forward(d_out.data(), d_inp.data(), d_w.data(), d_b.data(), N, C, OC);
  dev.layernorm_forward(d_ln.data(), d_mean.data(), d_rstd.data(), d_inp.data(), d_gamma.data(),
                        d_beta.data(), N, C);
  std::vector<float> out(out_cpu.size()), ln(ln_cpu.size());
  dev.to_host(out.data(), d_out.data(), out.size());
  dev.to_host(ln.data(), d_ln.data(), ln.size());
  CHECK(same_bits(out, out_cpu));
  CHECK(same_bits(ln, ln_cpu));
  CHECK(dev.owns(d_out.data()));
  CHECK_FALSE(dev.owns(out.data()));
  CHECK(dev.ops() == 9);
  // allocations start zeroed; scratch lives until reset_scratch
  std::vector<float> zeros(4, 1.0f);
  BackendBuffer fresh(dev, 4);
  dev.to_host(zeros.data(), fresh.data(), 4);
  CHECK(zeros == std::vector<float>(4, 0.0f));
  const size_t before = dev.regions();
  float* s = dev.scratch(100);
  CHECK(dev.owns(s));
  CHECK(dev.regions() == before + 1);
  dev.reset_scratch();
  CHECK(dev.regions() == before);
  CHECK_FALSE(dev.owns(s));
}

TEST_CASE("host pointers, overruns, released memory and index arrays in its memory are refused") {
  Context ctx(1);
  CheckedBackend dev(ctx);
  BackendBuffer a(dev, 16), b(dev, 16);
  std::vector<float> host(16);
  CHECK_THROWS_WITH_AS(dev.accumulate(a.data(), host.data(), 16),
                       doctest::Contains("accumulate: src (16 floats at"), CheckFailure);
  CHECK_THROWS_WITH_AS(dev.accumulate(a.data(), host.data(), 16),
                       doctest::Contains("is not the backend's memory (host memory"), CheckFailure);
  CHECK_THROWS_WITH_AS(dev.fill_zero(a.data() + 8, 9),
                       doctest::Contains("fill_zero: dst (9 floats at"), CheckFailure);
  CHECK_THROWS_WITH_AS(dev.fill_zero(a.data() + 8, 9), doctest::Contains("runs past its end"),
                       CheckFailure);
  CHECK_THROWS_WITH_AS(dev.to_backend(a.data(), b.data(), 4),
                       doctest::Contains("to_backend: src (16 bytes at"), CheckFailure);
  CHECK_THROWS_WITH_AS(dev.to_host(host.data(), host.data(), 4),
                       doctest::Contains("to_host: src (4 floats"), CheckFailure);
  // rows are host memory, whatever backend computes
  std::vector<int32_t> rows = {0, 2};
  float* backend_rows = dev.allocate(2);
  CHECK_THROWS_WITH_AS(
      dev.gather_rows(b.data(), a.data(), reinterpret_cast<const int32_t*>(backend_rows), 2, 4),
      doctest::Contains("gather_rows: rows (8 bytes at"), CheckFailure);
  dev.gather_rows(b.data(), a.data(), rows.data(), 2, 4);  // rows 0 and 2 of (·,4): in a
  rows[1] = 3;  // row 3 of (·,4) ends at float 16: still inside
  dev.gather_rows(b.data(), a.data(), rows.data(), 2, 4);
  rows[1] = 4;  // past a's 16 floats
  CHECK_THROWS_WITH_AS(dev.gather_rows(b.data(), a.data(), rows.data(), 2, 4),
                       doctest::Contains("gather_rows: x (20 floats"), CheckFailure);
  dev.release(backend_rows);
  CHECK_THROWS_WITH_AS(dev.fill_zero(backend_rows, 2),
                       doctest::Contains("host memory, or memory released"), CheckFailure);
  CHECK_THROWS_WITH_AS(dev.release(host.data()),
                       doctest::Contains("which is no allocation of this backend"), CheckFailure);
  // a refused op leaves the memory closed and usable: the next op runs
  dev.fill_zero(a.data(), 16);
}

TEST_CASE("between ops its memory is closed: a host read faults, naming the address") {
  int err[2];
  REQUIRE(::pipe(err) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(err[1], STDERR_FILENO);
    // the test framework's crash report is the parent's business: the fault kills the child
    ::signal(SIGSEGV, SIG_DFL);
    Context ctx(1);
    CheckedBackend dev(ctx);
    float* p = dev.allocate(4);
    volatile float x = p[0];  // the host touching backend memory directly
    (void)x;
    ::_exit(0);  // not reached
  }
  ::close(err[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(err[0], buf, sizeof buf)) > 0;)
    text.append(buf, static_cast<size_t>(n));
  ::close(err[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  CHECK(text.find("actorpipe: SIGSEGV at 0x") != std::string::npos);
  CHECK(text.find("a CheckedBackend closes its memory between ops") != std::string::npos);
}

TEST_CASE("without the guard only the pointer checks: the host may read its memory") {
  Context ctx(1);
  CheckedBackend dev(ctx, /*guard=*/false);
  float* p = dev.allocate(4);
  CHECK(p[0] == 0.0f);
  CHECK_THROWS_AS(dev.fill_zero(p, 5), CheckFailure);
  dev.release(p);
  CHECK(dev.name().find("checked cpu") == 0);
}

TEST_CASE("a companion works on the same memory with threads and scratch of its own") {
  Context ctx(1), other(2);
  CheckedBackend dev(ctx);
  const auto v = pattern(64, 0.5f), g = pattern(64, 0.25f);
  float* p = dev.allocate(64);
  float* grad = dev.allocate(64);
  dev.to_backend(p, v.data(), 64);
  dev.to_backend(grad, g.data(), 64);
  const size_t regions = dev.regions();
  std::vector<float> back(64);
  {
    std::unique_ptr<ComputeBackend> twin = dev.companion(other);
    CHECK(twin->name() == "checked cpu (2 threads), guarded");
    CHECK_FALSE(twin->host_memory());
    // an op of the companion on the first backend's memory: the CPU kernel's bits
    const double want = make_cpu_backend(ctx)->grad_sumsq(g.data(), 64);
    CHECK(twin->grad_sumsq(grad, 64) == want);
    twin->scale_inplace(p, 2.0f, 64);
    dev.to_host(back.data(), p, 64);
    for (size_t i = 0; i < 64; ++i) REQUIRE(back[i] == 2.0f * v[i]);
    // its scratch is its own: a reset of either frees only its own blocks
    float* s = twin->scratch(16);
    dev.scratch(8);
    CHECK(dev.regions() == regions + 2);
    dev.reset_scratch();
    CHECK(dev.regions() == regions + 1);
    twin->to_backend(s, v.data(), 16);  // still the companion's
    float* q = twin->allocate(8);       // an allocation of the shared memory: both take it
    dev.fill_zero(q, 8);
    twin->release(q);
    CHECK_THROWS_WITH_AS(twin->to_host(back.data(), back.data(), 4),
                         doctest::Contains("src (4 floats at"), CheckFailure);
  }
  CHECK(dev.regions() == regions);  // the companion's scratch went with it, the memory stays
  dev.to_host(back.data(), grad, 64);
  CHECK(same_bits(back, g));
  dev.release(p);
  dev.release(grad);
}
