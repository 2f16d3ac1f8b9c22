// Actor exits tests: the wait ends only after every other attachable of an ending actor has run
// (a monitor's down message comes earlier), counts an actor that has ended already, and waits
// for every watched actor.
#include "actors/internal/actor_exits.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <caf/all.hpp>
#include <chrono>
#include <future>

namespace actorpipe::internal {
namespace {

using namespace std::chrono_literals;

// Function actors here take an argument: CAF 0.17 spawns one without any through a null
// std::tuple<> pointer, which UBSan reports.
caf::behavior idle(caf::event_based_actor*, int) {
  return {[](int) {}};
}

struct System {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  System() {
    cfg.set("scheduler.max-threads", 1);
    sys = std::make_unique<caf::actor_system>(cfg);
  }
};

TEST_CASE(
    "the wait ends after the ending actor's other attachables, a monitor's down message before") {
  System s;
  caf::actor a = s.sys->spawn<caf::detached>(idle, 0);
  ActorExits exits;
  exits.watch(a);
  // attached after watch(): runs before its functor, and holds the end up until released
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  auto older_done = std::make_shared<std::atomic<bool>>(false);
  caf::actor_cast<caf::abstract_actor*>(a)->attach_functor([released, older_done] {
    if (released.wait_for(10s) == std::future_status::ready) older_done->store(true);
  });
  caf::scoped_actor self{*s.sys};
  self->monitor(a);
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  bool down = false;
  self->receive([&](caf::down_msg&) { down = true; }, caf::after(10s) >> [] {});
  REQUIRE(down);
  // the monitor has its down message while the end has not finished
  CHECK(exits.ended() == 0);
  CHECK_FALSE(older_done->load());
  release.set_value();
  exits.wait();
  CHECK(older_done->load());
  CHECK(exits.ended() == 1);
  CHECK(exits.watched() == 1);
}

TEST_CASE("an actor that has ended already counts at once, and the wait is for every actor") {
  System s;
  caf::actor gone = s.sys->spawn(idle, 0);
  {
    caf::scoped_actor self{*s.sys};
    self->monitor(gone);
    caf::anon_send_exit(gone, caf::exit_reason::user_shutdown);
    self->receive([](caf::down_msg&) {}, caf::after(10s) >> [] { FAIL("no down message"); });
  }
  ActorExits exits;
  exits.watch(gone);
  CHECK(exits.ended() == 1);
  caf::actor b = s.sys->spawn<caf::detached>(idle, 0);
  caf::actor c = s.sys->spawn(idle, 0);
  exits.watch(b);
  exits.watch(c);
  CHECK(exits.watched() == 3);
  caf::anon_send_exit(b, caf::exit_reason::user_shutdown);
  // bounded: c is still alive, so the wait would not return
  for (int i = 0; i < 1000 && exits.ended() < 2; ++i) std::this_thread::sleep_for(1ms);
  CHECK(exits.ended() == 2);
  auto waiting = std::async(std::launch::async, [&] { exits.wait(); });
  CHECK(waiting.wait_for(50ms) == std::future_status::timeout);
  caf::anon_send_exit(c, caf::exit_reason::user_shutdown);
  REQUIRE(waiting.wait_for(10s) == std::future_status::ready);
  CHECK(exits.ended() == 3);
}

}  // namespace
}  // namespace actorpipe::internal
