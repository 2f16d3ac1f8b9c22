// Supervisor: the restart loop of a training (attempt, wait, rebuild from the checkpoint, again).
#include "actors/supervisor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

namespace actorpipe {

std::string failure_without_numbers(const std::string& error) {
  std::string out;
  for (size_t i = 0; i < error.size(); ++i) {
    const bool digit = error[i] >= '0' && error[i] <= '9';
    if (!digit) {
      out += error[i];
    } else if (i == 0 || !(error[i - 1] >= '0' && error[i - 1] <= '9')) {
      out += '#';
    }
  }
  return out;
}

Supervisor::Supervisor(RestartPolicy policy) : policy_(policy) {}

double Supervisor::backoff(int k) const {
  if (k < 1 || policy_.backoff_seconds <= 0.0) return 0.0;
  const double wait = policy_.backoff_seconds * std::exp2(std::min(k - 1, 30));
  return std::min(wait, policy_.max_backoff_seconds);
}

Status Supervisor::run(const std::function<Status()>& attempt,
                       const std::function<Status(const RestartEvent&)>& restart,
                       const StopFlag* stop, const std::function<long()>& progress) {
  auto stopping = [stop] { return stop != nullptr && stop->requested(); };
  std::string last_error;  // the failure before the last restart (without_numbers), its step
  long last_step = -1;
  for (;;) {
    Status done = attempt();
    if (done.ok()) return done;
    std::string error = done.error().message;
    const std::string after =
        restarts_ > 0 ? fmt::format(" (after {} restart{})", restarts_, restarts_ == 1 ? "" : "s")
                      : std::string();
    if (restarts_ >= policy_.max_restarts) return Error{error + after};
    if (stopping()) return Error{error + after + "; not restarted: a stop was asked"};
    const long step = progress ? progress() : -1;
    if (progress && restarts_ > 0 && failure_without_numbers(error) == last_error &&
        step <= last_step) {
      return Error{error + after +
                   fmt::format("; not restarted again: the same failure at step {} as before "
                               "restart {}",
                               step, restarts_)};
    }
    last_error = failure_without_numbers(error);
    last_step = step;

    RestartEvent e;
    e.restart = restarts_ + 1;
    e.max_restarts = policy_.max_restarts;
    e.error = error;
    const auto start = std::chrono::steady_clock::now();
    const auto until = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(backoff(e.restart)));
    while (std::chrono::steady_clock::now() < until && !stopping()) {
      const auto left = until - std::chrono::steady_clock::now();
      std::this_thread::sleep_for(
          std::min<std::chrono::steady_clock::duration>(left, std::chrono::milliseconds(50)));
    }
    if (stopping()) return Error{error + after + "; not restarted: a stop was asked"};
    e.waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++restarts_;
    if (Status ok = restart(e); !ok) {
      return make_error("restart {} of {} failed: {} (it followed: {})", e.restart, e.max_restarts,
                        ok.error().message, error);
    }
  }
}

}  // namespace actorpipe
