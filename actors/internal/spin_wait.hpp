// Spin wait: an actor that is about to sleep for a message it expects soon polls its mailbox for
// a bounded time first, so a prompt reply costs no thread wake-up.
#pragma once

#include <caf/scheduled_actor.hpp>
#include <chrono>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace actorpipe::internal {

/// Returns once `self`'s mailbox holds a message or `budget` has passed, whichever is first.
/// Call it from one of `self`'s handlers, as the last thing before returning, when the actor
/// waits for a message: if one arrives during the spin, CAF dispatches it right after the handler
/// returns instead of parking the actor's thread and waking it again (a futex wake-up costs
/// tens of microseconds on a virtual machine). A zero budget returns at once.
inline void spin_for_mail(caf::scheduled_actor& self, std::chrono::nanoseconds budget) {
  if (budget.count() <= 0) return;
  const auto until = std::chrono::steady_clock::now() + budget;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (!self.mailbox().empty()) return;
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
    }
    if (std::chrono::steady_clock::now() >= until) return;
    // with more runnable threads than cores (stages, shards, the driver), the one that will
    // send the message may be waiting for this core: let it run
    std::this_thread::yield();
  }
}

}  // namespace actorpipe::internal
