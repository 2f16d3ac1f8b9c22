// Supervisor tests: attempts until one succeeds, at most max_restarts restarts, the doubling
// backoff with its cap, a failed restart, a stop during the wait.
#include "actors/supervisor.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <thread>
#include <vector>

using namespace actorpipe;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("backoff doubles from backoff_seconds and stops at max_backoff_seconds") {
  Supervisor s({5, 1.5, 10.0});
  CHECK(s.backoff(1) == 1.5);
  CHECK(s.backoff(2) == 3.0);
  CHECK(s.backoff(3) == 6.0);
  CHECK(s.backoff(4) == 10.0);
  CHECK(s.backoff(1000) == 10.0);
  CHECK(Supervisor({5, 0.0, 10.0}).backoff(3) == 0.0);
}

TEST_CASE("failed attempts are restarted until one succeeds, each restart told why") {
  Supervisor s({3, 0.01, 1.0});
  int attempts = 0;
  std::vector<RestartEvent> events;
  Status done = s.run(
      [&]() -> Status {
        ++attempts;
        if (attempts < 3) return make_error("attempt {} failed", attempts);
        return {};
      },
      [&](const RestartEvent& e) -> Status {
        events.push_back(e);
        return {};
      });
  CHECK(done.ok());
  CHECK(attempts == 3);
  CHECK(s.restarts() == 2);
  REQUIRE(events.size() == 2);
  CHECK(events[0].restart == 1);
  CHECK(events[0].max_restarts == 3);
  CHECK(events[0].error == "attempt 1 failed");
  CHECK(events[0].waited >= 0.01);
  CHECK(events[1].restart == 2);
  CHECK(events[1].error == "attempt 2 failed");
  CHECK(events[1].waited >= 0.02);
}

TEST_CASE("no restart left: the last failure, saying how many restarts came before") {
  int attempts = 0;
  auto fail = [&]() -> Status { return make_error("failure {}", ++attempts); };
  auto ok = [](const RestartEvent&) -> Status { return {}; };
  Supervisor none({0, 0.0, 1.0});
  Status a = none.run(fail, ok);
  REQUIRE_FALSE(a.ok());
  CHECK(a.error().message == "failure 1");
  CHECK(none.restarts() == 0);

  attempts = 0;
  Supervisor two({2, 0.0, 1.0});
  Status b = two.run(fail, ok);
  REQUIRE_FALSE(b.ok());
  CHECK(b.error().message == "failure 3 (after 2 restarts)");
  CHECK(attempts == 3);
}

TEST_CASE("a restart that fails ends the supervision naming both failures") {
  Supervisor s({3, 0.0, 1.0});
  int attempts = 0;
  Status done = s.run([&]() -> Status { return make_error("stage 1 threw ({})", ++attempts); },
                      [](const RestartEvent&) -> Status { return make_error("disk gone"); });
  REQUIRE_FALSE(done.ok());
  CHECK(done.error().message ==
        "restart 1 of 3 failed: disk gone (it followed: stage 1 threw (1))");
  CHECK(attempts == 1);
}

TEST_CASE("a stop asked during the wait ends it at once, without a restart") {
  Supervisor s({3, 30.0, 60.0});
  StopFlag stop;
  int restarted = 0;
  std::thread asker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    stop.request(15);
  });
  const auto t0 = std::chrono::steady_clock::now();
  Status done = s.run([]() -> Status { return make_error("boom"); },
                      [&](const RestartEvent&) -> Status {
                        ++restarted;
                        return {};
                      },
                      &stop);
  asker.join();
  CHECK(seconds_since(t0) < 5.0);  // not the 30 s backoff
  REQUIRE_FALSE(done.ok());
  CHECK(done.error().message == "boom; not restarted: a stop was asked");
  CHECK(restarted == 0);
  CHECK(s.restarts() == 0);
}
