// Scratch pool: the smallest buffer of the memory asked for that fits is reused (same memory,
// zeroed), a new one is allocated only when none fits, the byte counts say which, and a buffer
// is never handed out for another memory. On a CheckedBackend the pool touches the memory only
// through its operations.
#include "engine/execution/scratch_pool.hpp"

#include <doctest/doctest.h>

#include <vector>

#include "kernels/checked_backend.hpp"
#include "kernels/context.hpp"

namespace actorpipe {
namespace {

// a buffer of `memory` holding n copies of x
BackendBuffer filled(BackendMemory& memory, size_t n, float x) {
  BackendBuffer b(memory, n);
  const std::vector<float> v(n, x);
  memory.to_backend(b.data(), v.data(), n);
  return b;
}

bool zeros(BackendMemory& memory, const BackendBuffer& b, size_t n) {
  std::vector<float> v(n, 1.0f);
  memory.to_host(v.data(), b.data(), n);
  for (float x : v)
    if (x != 0.0f) return false;
  return true;
}

}  // namespace

TEST_CASE("scratch pool: the smallest kept buffer that holds n is handed out, zeroed") {
  Context ctx(1);
  CheckedBackend checked(ctx);  // every access outside its operations faults
  for (BackendMemory* memory : {&host_backend_memory(), static_cast<BackendMemory*>(&checked)}) {
    CAPTURE(memory->name());
    BackendMemory& mem = *memory;
    ScratchPool pool;
    BackendBuffer small = filled(mem, 100, 1.0f), big = filled(mem, 1000, 2.0f),
                  mid = filled(mem, 400, 3.0f);
    const float* mid_data = mid.data();
    const float* big_data = big.data();
    pool.give(std::move(small));
    pool.give(std::move(big));
    pool.give(std::move(mid));
    pool.give({});  // dropped
    CHECK(pool.bytes_kept() == 1500 * sizeof(float));

    BackendBuffer a = pool.take(mem, 300);  // 400 is the smallest that holds 300
    CHECK(a.data() == mid_data);
    CHECK(a.size() == 400);
    CHECK(a.memory() == &mem);
    CHECK(zeros(mem, a, 300));
    CHECK(pool.bytes_reused() == 400 * sizeof(float));
    CHECK(pool.bytes_kept() == 1100 * sizeof(float));

    BackendBuffer b = pool.take(mem, 1000);  // exactly the big one
    CHECK(b.data() == big_data);
    CHECK(zeros(mem, b, 1000));

    BackendBuffer c = pool.take(mem, 101);  // only 100 left: a new buffer
    CHECK(c.size() == 101);
    CHECK(zeros(mem, c, 101));
    CHECK(pool.bytes_allocated() == 101 * sizeof(float));
    CHECK(pool.bytes_kept() == 100 * sizeof(float));
    CHECK(pool.take(mem, 0).empty());
    CHECK(pool.bytes_allocated() == 101 * sizeof(float));
  }
}

TEST_CASE("scratch pool: a buffer is handed out only for the memory it came from") {
  Context ctx(1);
  CheckedBackend checked(ctx);
  ScratchPool pool;
  BackendBuffer host = filled(host_backend_memory(), 64, 5.0f);
  const float* host_data = host.data();
  pool.give(std::move(host));
  BackendBuffer d = pool.take(checked, 32);  // the host buffer would fit, but is not its memory
  CHECK(d.data() != host_data);
  CHECK(checked.owns(d.data()));
  CHECK(pool.bytes_allocated() == 32 * sizeof(float));
  CHECK(pool.bytes_kept() == 64 * sizeof(float));
  pool.give(std::move(d));
  BackendBuffer h = pool.take(host_backend_memory(), 48);
  CHECK(h.data() == host_data);
  CHECK(pool.bytes_kept() == 32 * sizeof(float));
  // the pool's remaining buffer goes back to its own memory when the pool goes (the
  // CheckedBackend outlives the pool: declared first)
}

TEST_CASE("scratch pool: assign_zeros without a pool keeps the buffer's own memory") {
  BackendMemory& mem = host_backend_memory();
  BackendBuffer v = filled(mem, 50, 7.0f);
  const float* data = v.data();
  assign_zeros(v, mem, 20, nullptr);
  CHECK(v.data() == data);
  CHECK(v.size() == 50);
  CHECK(zeros(mem, v, 20));
  CHECK(v.data()[20] == 7.0f);        // past n: untouched (dead)
  assign_zeros(v, mem, 60, nullptr);  // does not hold 60: a new buffer
  CHECK(v.size() == 60);
  CHECK(zeros(mem, v, 60));
  ScratchPool pool;
  BackendBuffer kept = filled(mem, 64, 1.0f);
  const float* kept_data = kept.data();
  pool.give(std::move(kept));
  assign_zeros(v, mem, 64, &pool);
  CHECK(v.data() == kept_data);
  CHECK(zeros(mem, v, 64));
  assign_zeros(v, mem, 0, nullptr);
  CHECK(v.empty());
}

}  // namespace actorpipe
