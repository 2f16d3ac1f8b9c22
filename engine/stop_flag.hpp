// StopFlag: a request to end training after the step in flight, set from any thread or from a
// signal handler and read by the executors between steps; signal_name for the messages.
#pragma once

#include <string.h>  // sigabbrev_np

#include <atomic>
#include <string>

namespace actorpipe {

/// One lock-free atomic: request() is async-signal-safe. The request stays until clear().
/// `signal` is what asked (a signal number, or 0 when the program itself asked), for messages.
class StopFlag {
 public:
  void request(int signal = 0) noexcept {
    int none = -1;
    // the first request's signal is the one reported
    signal_.compare_exchange_strong(none, signal, std::memory_order_relaxed);
    requested_.store(true, std::memory_order_release);
  }
  bool requested() const noexcept { return requested_.load(std::memory_order_acquire); }
  /// The first request's signal (0: the program asked), or -1 before any request.
  int signal() const noexcept { return signal_.load(std::memory_order_relaxed); }
  void clear() noexcept {
    requested_.store(false, std::memory_order_release);
    signal_.store(-1, std::memory_order_relaxed);
  }

 private:
  static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
                "a signal handler may only touch lock-free atomics");
  std::atomic<bool> requested_{false};
  std::atomic<int> signal_{-1};
};

/// "SIGTERM" (or "signal 77" for a number without a name): how messages name a signal.
inline std::string signal_name(int signal) {
  if (const char* abbrev = signal > 0 ? ::sigabbrev_np(signal) : nullptr)
    return std::string("SIG") + abbrev;
  return "signal " + std::to_string(signal);
}

}  // namespace actorpipe
