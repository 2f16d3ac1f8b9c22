// Replica reducer: the gradient all-reduce of a job's data-parallel replicas
// (pipeline.replicas): one Gloo group per pipeline stage, joining the processes that run that
// stage in each replica, connected at start through the job's process group.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/execution/gradient_reducer.hpp"
#include "engine/expected.hpp"
#include "engine/model/placement.hpp"

namespace actorpipe {

class GlooGroup;
class ProcessGroup;

/// A GradientReducer across processes: for each stage this process runs, a GlooGroup of the w
/// processes that run it (member q = replica q), whose all_reduce_sum adds in replica order, as
/// GradientReducer requires. Each stage's group is used by that stage's optimizer shard only.
/// Each stage's all-reduces run on a thread of their own (one per stage held here), in the order
/// they were asked for: the pieces a stage posts while its backward goes on (post), then
/// anything all_reduce must still sum.
class ReplicaReducer final : public GradientReducer {
 public:
  /// One all-reduce as it ran, for traces and benchmarks.
  struct Call {
    int stage = 0;
    long step = 0;
    int64_t floats = 0;
    std::chrono::steady_clock::time_point start, end;
  };

  /// Connects the groups: every rank of `group` calls it with the same `replicas` (replica q's
  /// placement, Placement::make(..., q)); stage by stage, each rank takes part in one all-gather
  /// of the job (the texts of a stage's members connect its group; the others contribute
  /// nothing), so the rounds line up on every rank. The TCP device binds the address this
  /// process reaches the coordinator from. `timeout`: connecting, and each all-reduce (a replica
  /// that falls further behind fails the update). Errors name the stage and the cause.
  static Expected<std::unique_ptr<ReplicaReducer>> connect(ProcessGroup& group,
                                                           const std::vector<Placement>& replicas,
                                                           std::chrono::milliseconds timeout);
  ~ReplicaReducer() override;
  ReplicaReducer(const ReplicaReducer&) = delete;
  ReplicaReducer& operator=(const ReplicaReducer&) = delete;

  int replicas() const override { return replicas_; }
  /// Stage `stage`'s gradients summed over the replicas (a stage this process runs): waits for
  /// the pieces of `step` posted before, or sums `data` whole when none were. Errors: Gloo's,
  /// and posts that covered only part of `data`.
  Status all_reduce(int stage, long step, std::span<float> data) override;
  /// Queues `part` on the stage's thread; false after an error of that stage's group.
  bool post(int stage, long step, std::span<float> part) override;
  /// The calls since the last take, every stage's, in the order they ended per stage.
  std::vector<Call> take_calls();
  /// Bytes this process sent in all-reduces so far, all stages together.
  int64_t bytes_sent() const;
  /// Gloo's error of stage `stage`, naming the group's ranks; and, first, a lost rank the
  /// process group learns of within a short wait (a killed peer closes the Gloo connections at
  /// once, often before the process group notices), which is then the cause.
  std::string failure(int stage, const std::string& gloo);
  /// The address the groups' TCP devices bound.
  const std::string& host() const { return host_; }

 private:
  ReplicaReducer() = default;
  struct Lane;
  Lane* lane(int stage);

  int replicas_ = 1;
  std::string host_;
  ProcessGroup* group_ = nullptr;
  std::vector<std::vector<int>> members_;     // per stage: the ranks of its group, by replica
  std::vector<std::unique_ptr<Lane>> lanes_;  // per stage; null where not run here
};

/// The local address this host reaches `host`:`port` from (a UDP socket connected there: no
/// packet is sent); "127.0.0.1" for a loopback host. Errors name the host and the cause.
Expected<std::string> local_address_towards(const std::string& host, int port);

}  // namespace actorpipe
