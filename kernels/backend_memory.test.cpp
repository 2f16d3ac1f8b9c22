#include "kernels/backend_memory.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/check.hpp"
#include "kernels/checked_backend.hpp"
#include "kernels/context.hpp"
#include "kernels/tensor_pool.hpp"

using namespace actorpipe;

namespace {
std::vector<float> ramp(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}
}  // namespace

TEST_CASE("a tensor in a lasting memory off the host: not host-readable, read through host_copy") {
  Context ctx(1);
  CheckedBackend device(ctx);
  BackendMemory& lasting = device.lasting_memory();
  CHECK(&lasting.lasting_memory() == &lasting);
  CHECK_FALSE(lasting.host_memory());
  Tensor t = Tensor::zeros({4, 8}, DType::f32, lasting);
  CHECK_FALSE(t.host_readable());
  CHECK(t.memory() == &lasting);
  CHECK(t.describe() == "f32[4, 8] checked device memory");
  const std::vector<float> v = ramp(32, 1.0f);
  lasting.to_backend(t.f32(), v.data(), v.size());
  const Tensor h = host_copy(t);
  REQUIRE(h.host_readable());
  CHECK(h.memory() == nullptr);
  CHECK(std::memcmp(h.f32(), v.data(), v.size() * sizeof(float)) == 0);
  CHECK_THROWS_AS((void)t.clone(), CheckFailure);
  // a host tensor is its own host copy
  CHECK(host_copy(h).storage() == h.storage());
  // the host's lasting memory is host memory
  CHECK(&host_backend_memory().lasting_memory() == &host_backend_memory());
}

TEST_CASE("transfer moves floats between the host, two backends and a lasting memory") {
  Context ctx(1);
  CheckedBackend a(ctx), b(ctx);
  BackendMemory& lasting = a.lasting_memory();
  const size_t n = 1000;
  const std::vector<float> v = ramp(n, -3.5f);
  BackendBuffer in_a(a, n), in_b(b, n), out_a(a, n);
  Tensor edge = Tensor::zeros({static_cast<int64_t>(n)}, DType::f32, lasting);
  transfer(a, in_a.data(), host_backend_memory(), v.data(), n);  // host -> a
  transfer(lasting, edge.f32(), a, in_a.data(), n);              // a -> lasting (through host)
  transfer(b, in_b.data(), lasting, edge.f32(), n);              // lasting -> b (through host)
  transfer(a, out_a.data(), a, in_a.data(), n);                  // a -> a
  std::vector<float> back(n), back_a(n);
  transfer(host_backend_memory(), back.data(), b, in_b.data(), n);  // b -> host
  a.to_host(back_a.data(), out_a.data(), n);
  CHECK(back == v);
  CHECK(back_a == v);
  // nothing to do for n = 0
  transfer(b, in_b.data(), a, nullptr, 0);
}

TEST_CASE("a tensor pool in a backend memory hands out tensors there and reuses them") {
  Context ctx(1);
  CheckedBackend device(ctx);
  BackendMemory& lasting = device.lasting_memory();
  TensorPool pool({2, 3}, 1, DType::f32, &lasting);
  CHECK(pool.memory() == &lasting);
  Tensor x = pool.acquire();
  CHECK(x.memory() == &lasting);
  CHECK_FALSE(x.host_readable());
  const void* first = x.storage()->data();
  Tensor y = pool.acquire();  // x is held: a second one
  CHECK(pool.size() == 2);
  x = Tensor();
  CHECK(pool.acquire().storage()->data() == first);
  TensorPool host_pool({2}, 1);
  CHECK(host_pool.acquire().host_readable());
}
