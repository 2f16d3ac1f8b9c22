// Scratch pool: the smallest buffer that fits is reused (same memory, zeroed), a new one is
// allocated only when none fits, and the byte counts say which.
#include "engine/execution/scratch_pool.hpp"

#include <doctest/doctest.h>

namespace actorpipe {

TEST_CASE("scratch pool: the smallest kept buffer that holds n is handed out, zeroed") {
  ScratchPool pool;
  std::vector<float> small(100, 1.0f), big(1000, 2.0f), mid(400, 3.0f);
  const float* mid_data = mid.data();
  const float* big_data = big.data();
  pool.give(std::move(small));
  pool.give(std::move(big));
  pool.give(std::move(mid));
  pool.give({});  // dropped
  CHECK(pool.bytes_kept() == 1500 * sizeof(float));

  std::vector<float> a = pool.take(300);  // 400 is the smallest that holds 300
  CHECK(a.data() == mid_data);
  CHECK(a.size() == 300);
  CHECK(a.capacity() == 400);
  for (float x : a) REQUIRE(x == 0.0f);
  CHECK(pool.bytes_reused() == 400 * sizeof(float));
  CHECK(pool.bytes_kept() == 1100 * sizeof(float));

  std::vector<float> b = pool.take(1000);  // exactly the big one
  CHECK(b.data() == big_data);
  for (float x : b) REQUIRE(x == 0.0f);

  std::vector<float> c = pool.take(101);  // only 100 left: a new buffer
  CHECK(c.size() == 101);
  for (float x : c) REQUIRE(x == 0.0f);
  CHECK(pool.bytes_allocated() == 101 * sizeof(float));
  CHECK(pool.bytes_kept() == 100 * sizeof(float));
  CHECK(pool.take(0).empty());
  CHECK(pool.bytes_allocated() == 101 * sizeof(float));
}

TEST_CASE("scratch pool: assign_zeros without a pool keeps the vector's own buffer") {
  std::vector<float> v(50, 7.0f);
  const float* data = v.data();
  assign_zeros(v, 20, nullptr);
  CHECK(v.data() == data);
  CHECK(v.size() == 20);
  for (float x : v) REQUIRE(x == 0.0f);
  ScratchPool pool;
  std::vector<float> kept(64, 1.0f);
  const float* kept_data = kept.data();
  pool.give(std::move(kept));
  assign_zeros(v, 64, &pool);
  CHECK(v.data() == kept_data);
  CHECK(v.size() == 64);
}

}  // namespace actorpipe
