// Gloo bandwidth: the timing runs, reports what a member sends, and refuses nonsense.
#include "transport/gloo_bandwidth.hpp"

#include <doctest/doctest.h>

using namespace actorpipe;

TEST_CASE("the all-reduce timing measures a positive time and bandwidth") {
  auto t = time_local_all_reduce(2, 1 << 16, 3);
  REQUIRE_MESSAGE(t.ok(), (t.ok() ? "" : t.error().message));
  CHECK(t->members == 2);
  CHECK(t->floats == 1 << 16);
  CHECK(t->seconds > 0.0);
  // a member of two sends half of the buffer twice (alltoall, allgather): the buffer's bytes
  CHECK(t->bytes_per_second == doctest::Approx(4.0 * (1 << 16) / t->seconds));
  CHECK_FALSE(time_local_all_reduce(1, 10, 1).ok());
  CHECK_FALSE(time_local_all_reduce(2, 0, 1).ok());
  CHECK_FALSE(time_local_all_reduce(2, 10, 0).ok());
}

TEST_CASE("the all-reduce cost: a latency and a bandwidth from two calls") {
  auto c = measure_all_reduce_cost(1 << 18, 3);
  REQUIRE_MESSAGE(c.ok(), (c.ok() ? "" : c.error().message));
  CHECK(c->latency == c->tiny.seconds);
  CHECK(c->tiny.floats == 1);
  CHECK(c->large.floats == 1 << 18);
  CHECK(c->bandwidth > 0.0);
}
