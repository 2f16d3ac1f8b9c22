// A deliberate leak through CAF, for the AddressSanitizer build only: a handle to an actor that is
// never released keeps the actor's memory after the actor system is gone. The program itself
// succeeds; LeakSanitizer must fail it, with the suppressions every executable carries
// (lsan_suppressions.cpp) in force (tests.sanitizers.leaky_actor).
#include <caf/all.hpp>
#include <cstdio>

namespace {

// (an argument: CAF 0.17's spawn of a function without one dereferences a null argument tuple,
// which UndefinedBehaviorSanitizer reports)
caf::behavior adder(int offset) {
  return {[offset](int x) { return x + offset; }};
}

[[gnu::noinline]] caf::actor* leak_a_handle(caf::actor_system& sys) {
  return new caf::actor(sys.spawn(adder, 0));  // never deleted
}

}  // namespace

int main() {
  caf::actor* leaked = nullptr;
  {
    caf::actor_system_config cfg;
    caf::actor_system sys{cfg};
    leaked = leak_a_handle(sys);
    caf::scoped_actor self{sys};
    int got = 0;
    self->request(*leaked, caf::infinite, 21)
        .receive([&](int x) { got = x; }, [&](caf::error&) { got = -1; });
    caf::anon_send_exit(*leaked, caf::exit_reason::user_shutdown);
    if (got != 21) return 2;
  }
  std::fprintf(stderr, "leaky_actor: done, one actor handle never released\n");
  leaked = nullptr;  // the last pointer to it is gone: a definite leak
  return 0;
}
