// LeakSanitizer's suppressions, compiled into every executable of an AddressSanitizer build
// (cmake/ActorpipeHelpers.cmake), so that a test, a trainer it starts and a run by hand all judge
// leaks alike.
//
// One leak is libcaf's and not ours: when a peer process is lost (killed) while a rank's actor
// system shuts down, CAF 0.17.6's BASP broker (the middleman's actor for remote messages) can be
// left in a reference cycle with its connection tables, a pending message and the errors of the
// lost link; the cycle's memory is never freed. It depends on where the peer's death falls in the
// broker's work (tests.rank_loss saw it in about one run in twenty). Every chunk of that cycle is
// reachable from the broker, so suppressing the broker's allocation hides the whole cycle and
// nothing else: LeakSanitizer treats a suppressed chunk as a root and reports only what it cannot
// reach. A leak of our own, an actor or a message included, is still reported
// (tests.sanitizers.leaky_actor).
extern "C" __attribute__((visibility("default"), used)) const char* __lsan_default_suppressions() {
  return "leak:caf::io::basp_broker\n";
}
