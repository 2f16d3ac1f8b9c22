// Gradient reducer tests: the replica-order sum is the documented float loop (another order
// gives other bits), and replicas as threads meet per stage and step, concurrently across
// stages, and fail with a message naming the missing replica.
#include "engine/execution/gradient_reducer.hpp"

#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include "tests/support/bits.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

TEST_CASE("the sum runs in replica order") {
  // (1e8 + 1) - 1e8 = 0 in float; 1e8 + (1 - 1e8) = 0 too, but (-1e8 + 1e8) + 1 = 1
  const std::vector<float> a{1e8f, 3.0f}, b{1.0f, 4.0f}, c{-1e8f, 5.0f};
  std::vector<float> out(2);
  const std::vector<std::span<const float>> order{a, b, c};
  sum_in_replica_order(order, out);
  CHECK(out[0] == 0.0f);
  CHECK(out[1] == 12.0f);
  const std::vector<std::span<const float>> other{c, a, b};
  sum_in_replica_order(other, out);
  CHECK(out[0] == 1.0f);  // the order shows in the bits
  // longer than one block
  std::vector<float> x(10000), y(10000), z(10000);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(i) * 0.1f;
    y[i] = 1.0f / static_cast<float>(i + 1);
  }
  const std::vector<std::span<const float>> two{x, y};
  sum_in_replica_order(two, z);
  for (size_t i = 0; i < x.size(); ++i) REQUIRE(z[i] == x[i] + y[i]);
}

TEST_CASE("replicas as threads sum per stage and step, stages independently") {
  constexpr int kW = 3, kStages = 2, kSteps = 5;
  LocalReducer reducer(kW);
  // data[r][stage]
  std::vector<std::vector<std::vector<float>>> data(kW);
  std::vector<std::vector<std::vector<float>>> want(kStages);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < kW; ++r) {
      threads.emplace_back([&, r] {
        // each replica's stages on their own threads, as the optimizer actors call it
        std::vector<std::thread> stages;
        for (int s = 0; s < kStages; ++s) {
          stages.emplace_back([&, r, s] {
            std::vector<float> g(7 + static_cast<size_t>(s));
            for (int step = 1; step <= kSteps; ++step) {
              for (size_t i = 0; i < g.size(); ++i)
                g[i] = static_cast<float>(r * 100 + step) + 0.25f * static_cast<float>(i + s);
              REQUIRE(reducer.member(r).all_reduce(s, step, g).ok());
              for (size_t i = 0; i < g.size(); ++i) {
                float sum = 0.0f;
                for (int q = 0; q < kW; ++q) {
                  const float v = static_cast<float>(q * 100 + step) +
                                  0.25f * static_cast<float>(i + static_cast<size_t>(s));
                  sum = q == 0 ? v : sum + v;
                }
                REQUIRE(g[i] == sum);
              }
            }
          });
        }
        for (auto& t : stages) t.join();
      });
    }
    for (auto& t : threads) t.join();
  }
  CHECK(reducer.member(0).replicas() == kW);
}

TEST_CASE("a replica that never comes fails the others, naming it") {
  LocalReducer reducer(2, std::chrono::milliseconds(200));
  std::vector<float> g(4, 1.0f);
  auto st = reducer.member(0).all_reduce(1, 3, g);
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().message.find("stage 1, step 3: replica 0 waited 200 ms for replica(s) 1") !=
        std::string::npos);
  // and the reducer stays failed
  auto later = reducer.member(1).all_reduce(1, 3, g);
  CHECK_FALSE(later.ok());
}

TEST_CASE("abort wakes a waiting replica at once") {
  LocalReducer reducer(2, std::chrono::milliseconds(60000));
  std::vector<float> g(4, 1.0f);
  Status st;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread waiter([&] { st = reducer.member(0).all_reduce(0, 1, g); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  reducer.abort("replica 1 failed");
  waiter.join();
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().message == "replica 1 failed");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}
