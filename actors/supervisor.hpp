// Supervisor: runs a training and, when it fails, restarts it from its latest complete
// checkpoint up to a bounded number of times, with an exponentially growing wait between.
#pragma once

#include <functional>
#include <string>

#include "engine/expected.hpp"
#include "engine/stop_flag.hpp"

namespace actorpipe {

/// train.max_restarts and train.restart_backoff.
struct RestartPolicy {
  int max_restarts = 0;               ///< restarts after failures; 0: the first failure ends it
  double backoff_seconds = 1.0;       ///< the wait before the first restart
  double max_backoff_seconds = 60.0;  ///< the longest wait (the wait doubles each restart)
};

/// What the supervisor tells the restart it asks for.
struct RestartEvent {
  int restart = 0;       ///< 1 for the first restart
  int max_restarts = 0;  ///< RestartPolicy::max_restarts
  std::string error;     ///< why the attempt before failed
  double waited = 0.0;   ///< seconds waited before this restart
};

/// `error` with every run of digits replaced by '#': failures that differ only in their numbers
/// (a microbatch id counted from the rebuilt pipeline's start, a time) compare equal. What
/// Supervisor::run and the trainers' rejoin loop call the same failure.
std::string failure_without_numbers(const std::string& error);

class Supervisor {
 public:
  explicit Supervisor(RestartPolicy policy);

  /// Calls `attempt` until it succeeds. After a failed attempt, while restarts remain and no
  /// stop is requested, it waits backoff(k) (in slices of 50 ms, ending early on a stop), then
  /// calls `restart` (which rebuilds the training from its latest checkpoint) and tries again.
  /// Returns the first success; the last attempt's error when no restart remains ("... (after
  /// k restarts)" when there were some), with "; not restarted: a stop was asked" when a stop
  /// came; a failed restart's error naming the restart and the failure it followed.
  /// With `progress` (the step the training has reached), a failure that repeats the one before
  /// the last restart (the same error but for its numbers, such as a microbatch id counted from
  /// the rebuilt pipeline's start, at a step no further on) is not restarted again: it would
  /// fail the same way, and each restart waits longer. Its error ends "; not restarted again:
  /// the same failure at step N as before restart k".
  Status run(const std::function<Status()>& attempt,
             const std::function<Status(const RestartEvent&)>& restart,
             const StopFlag* stop = nullptr, const std::function<long()>& progress = {});

  /// Restarts done by run() so far.
  int restarts() const { return restarts_; }
  /// The wait before restart k (1-based): backoff_seconds · 2^(k-1), at most max_backoff_seconds.
  double backoff(int k) const;

 private:
  RestartPolicy policy_;
  int restarts_ = 0;
};

}  // namespace actorpipe
