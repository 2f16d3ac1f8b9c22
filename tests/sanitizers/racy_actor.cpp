// A deliberate data race inside a CAF actor, for the ThreadSanitizer build only: the actor's
// handler and the main thread both write `shared_counter` with nothing ordering the two writes.
// The racing frames are ours, but every stack of the actor's side ends in libcaf's scheduler,
// so a TSan suppression such as `race:libcaf_core` would hide this race; tsan_filter.awk must
// not (tests.sanitizers.racy_actor checks both).
#include <caf/all.hpp>
#include <cstdio>

namespace {

int shared_counter = 0;  // deliberately unsynchronised

[[gnu::noinline]] void racy_write_in_actor() {
  shared_counter += 2;
}
[[gnu::noinline]] void racy_write_in_main() {
  shared_counter += 1;
}

caf::behavior racer() {
  return {[](int x) {
    racy_write_in_actor();
    return x;
  }};
}

}  // namespace

int main() {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 2);
  caf::actor_system system{cfg};
  auto actor = system.spawn(racer);
  caf::scoped_actor self{system};
  // The message leaves before main's write, so nothing orders main's write before the
  // handler's; the reply orders the handler before main's read only.
  self->send(actor, 1);
  racy_write_in_main();
  self->receive([](int) {});
  std::printf("racy_actor: counter %d\n", shared_counter);
  self->send_exit(actor, caf::exit_reason::user_shutdown);
  return 0;
}
