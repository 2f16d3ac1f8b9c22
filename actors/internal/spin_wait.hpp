// Spin wait: an actor that is about to sleep for a message it expects soon polls its mailbox for
// a bounded time first, so a prompt reply costs no thread wake-up.
#pragma once

#include <caf/scheduled_actor.hpp>
#include <chrono>
#include <thread>

#include "transport/channel.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace actorpipe::internal {

/// Returns once `self`'s mailbox holds a message or `budget` has passed, whichever is first.
/// Call it from one of `self`'s handlers, as the last thing before returning, when the actor
/// waits for a message: if one arrives during the spin, CAF dispatches it right after the handler
/// returns instead of parking the actor's thread and waking it again (a futex wake-up costs
/// tens of microseconds on a virtual machine). A zero budget returns at once.
///
/// With a `poller` (the transport of the channels from other processes), the spin also drives
/// that transport: an input from another process (its announcement, handed to `self` as a
/// message) then lands on this thread without a wake-up of the transport's progress thread.
inline void spin_for_mail(caf::scheduled_actor& self, std::chrono::nanoseconds budget,
                          ChannelPoller* poller = nullptr) {
  if (budget.count() <= 0) return;
  const auto until = std::chrono::steady_clock::now() + budget;
  struct Waiting {
    caf::scheduled_actor& self;
    ChannelPoller* p;
    Waiting(caf::scheduled_actor& s, ChannelPoller* q) : self(s), p(q) {
      if (p != nullptr) p->begin_wait();
    }
    ~Waiting() {
      if (p != nullptr) p->end_wait(self.mailbox().empty());  // empty: the thread sleeps now
    }
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;
  } waiting(self, poller);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (!self.mailbox().empty()) return;
#if defined(__x86_64__) || defined(__i386__)
      _mm_pause();
#endif
    }
    // what the poll did (an announcement handed to `self`) is in the mailbox at the next look
    const bool polled = poller != nullptr && poller->poll();
    if (std::chrono::steady_clock::now() >= until) return;
    // with more runnable threads than cores (stages, shards, the driver), the one that will
    // send the message may be waiting for this core: let it run
    if (!polled) std::this_thread::yield();
  }
}

}  // namespace actorpipe::internal
