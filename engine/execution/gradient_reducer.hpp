// Gradient reducer: how the replicas of a data-parallel job (pipeline.replicas) sum a stage's
// gradients before its update, in a fixed order; and an in-process reducer for replicas that
// run as threads of one process (the serial reference of a replicated run).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/expected.hpp"
#include "kernels/backend_memory.hpp"

namespace actorpipe {

/// Sums a stage's gradients over the w replicas of a job. Every replica of a stage calls
/// all_reduce for each of the stage's updates, in update order, with gradients of the same
/// size; on return `data` holds Σ over replicas r = 0 .. w-1 of replica r's `data`, added
/// element-wise in replica order starting from replica 0's value (((d₀ + d₁) + d₂) + ...): the
/// same bits on every replica. Calls of different stages are independent (they may run
/// concurrently, on different threads). An error (a replica lost, a timeout) fails the update;
/// the reducer is then unusable.
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  /// w
  virtual int replicas() const = 0;
  /// `step`: the update's optimizer step (1-based), checked to agree where the implementation
  /// can.
  virtual Status all_reduce(int stage, long step, std::span<float> data) = 0;
  /// Optional, to overlap the sum with the rest of a backward: starts summing `part`, a piece of
  /// stage `stage`'s gradients of update `step` that is final already
  /// (StageWorker::on_final_gradients), in the background; the all_reduce of that update then
  /// waits for the posted pieces. Either the posts of an update cover its whole buffer or there
  /// are none. Returns false when the reducer does not do this (the default): all_reduce sums
  /// everything then.
  virtual bool post(int /*stage*/, long /*step*/, std::span<float> /*part*/) { return false; }
};

/// reducer.all_reduce(stage, step, data) for gradients that lie in `memory`: off the host they
/// are copied out (to_host), summed there and copied back (to_backend); the same bits.
Status all_reduce_in(GradientReducer& reducer, BackendMemory& memory, int stage, long step,
                     std::span<float> data);

/// The reduction itself: into[i] = ((parts[0][i] + parts[1][i]) + ...) for every i, in float.
/// Every part has into.size() floats. The one definition of the order every reducer follows.
void sum_in_replica_order(std::span<const std::span<const float>> parts, std::span<float> into);

/// Replicas as threads of one process: w callers (one per replica, each through its own
/// member()) meet per (stage, step); the last to arrive sums the w buffers in replica order
/// (sum_in_replica_order) into each of them, and all return. A caller that waits longer than
/// `timeout` for the others fails (naming the stage, the step and the replicas missing), and so
/// does every later call.
class LocalReducer {
 public:
  explicit LocalReducer(int replicas,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(60000));
  ~LocalReducer();
  LocalReducer(const LocalReducer&) = delete;
  LocalReducer& operator=(const LocalReducer&) = delete;

  int replicas() const { return w_; }
  /// Replica r's GradientReducer (owned by this object; valid while it lives).
  GradientReducer& member(int replica);
  /// A replica failed elsewhere: every waiting and later call fails at once with `reason`.
  void abort(const std::string& reason);

 private:
  class Member;
  struct Round {
    std::vector<std::span<float>> data;  // per replica, once arrived
    std::vector<bool> in;                // per replica: arrived
    int arrived = 0;
    int left = 0;  // replicas that have taken the result
    bool done = false;
  };
  Status reduce(int replica, int stage, long step, std::span<float> data);

  int w_;
  std::chrono::milliseconds timeout_;
  std::vector<std::unique_ptr<Member>> members_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int, long>, Round> rounds_;  // by (stage, step)
  std::string failed_;
};

}  // namespace actorpipe
