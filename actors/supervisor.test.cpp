// Supervisor tests: attempts until one succeeds, at most max_restarts restarts, the doubling
// backoff with its cap, a failed restart, a stop during the wait, a failure that repeats.
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

TEST_CASE("a failure that repeats the one before the last restart is not restarted again") {
  // the same error at the same step twice: one restart, then the error says why no more
  int attempts = 0, restarts = 0;
  Supervisor same({5, 0.0, 1.0});
  Status a = same.run([&]() -> Status { return ++attempts, make_error("non-finite loss"); },
                      [&](const RestartEvent&) -> Status { return ++restarts, Status{}; }, nullptr,
                      [] { return 8L; });
  REQUIRE_FALSE(a.ok());
  CHECK(attempts == 2);
  CHECK(restarts == 1);
  CHECK(a.error().message ==
        "non-finite loss (after 1 restart); not restarted again: the same failure at step 8 as "
        "before restart 1");

  // progress between the failures, or another error: restarted as before, up to the limit
  long step = 0;
  attempts = 0;
  Supervisor progressing({3, 0.0, 1.0});
  Status b = progressing.run([&]() -> Status { return ++attempts, step += 2, make_error("stall"); },
                             [&](const RestartEvent&) -> Status { return {}; }, nullptr,
                             [&] { return step; });
  CHECK(attempts == 4);
  CHECK(b.error().message == "stall (after 3 restarts)");
  attempts = 0;
  Supervisor changing({3, 0.0, 1.0});
  Status c = changing.run(
      [&]() -> Status { return Error{++attempts % 2 == 1 ? "a stall" : "a lost rank"}; },
      [&](const RestartEvent&) -> Status { return {}; }, nullptr, [] { return 4L; });
  CHECK(attempts == 4);
  CHECK(c.error().message == "a lost rank (after 3 restarts)");

  // without a progress callback every failure is restarted (the launcher's use)
  attempts = 0;
  Supervisor blind({2, 0.0, 1.0});
  Status d = blind.run([&]() -> Status { return ++attempts, make_error("the same"); },
                       [&](const RestartEvent&) -> Status { return {}; });
  CHECK(attempts == 3);
  CHECK(d.error().message == "the same (after 2 restarts)");
}

TEST_CASE("a repeated failure is recognised although its numbers differ") {
  int attempts = 0;
  Supervisor s({4, 0.0, 1.0});
  Status a = s.run(
      [&]() -> Status {
        return make_error("stage 1, microbatch {} (1F0): non-finite loss", 4 * (++attempts % 2));
      },
      [&](const RestartEvent&) -> Status { return {}; }, nullptr, [] { return 3L; });
  CHECK(attempts == 2);
  CHECK(a.error().message ==
        "stage 1, microbatch 0 (1F0): non-finite loss (after 1 restart); not restarted again: the "
        "same failure at step 3 as before restart 1");
}
