// Deterministic replay of a schedule: every stage runs its actions in order, an action starts when
// its cross-stage dependency has executed. The grid, the validator and the simulator share it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/schedule/schedule.hpp"

namespace actorpipe::internal {

/// Finds an action of a schedule by (stage, kind, microbatch): the first occurrence. The stage is
/// the list the action is in (per_stage[stage]), whatever its `stage` field says.
class ActionIndex {
 public:
  explicit ActionIndex(const Schedule& schedule);
  /// Index into per_stage[stage], or -1 when absent.
  int find(int stage, ActionKind kind, int microbatch) const;

 private:
  std::unordered_map<uint64_t, int> map_;
};

/// The action on another stage that must have executed before an action may start.
/// Compute-only schedules: F at r > 0 waits for F at r-1, B at r < d-1 waits for B at r+1.
/// Lowered schedules: RECV_F at r waits for SEND_F at r-1, RECV_B at r for SEND_B at r+1.
/// FLUSH is a barrier and has no single dependency (see replay()).
struct Dependency {
  bool exists = false;  ///< the action has a cross-stage dependency
  Action wanted;        ///< the action it waits for
  int index = -1;       ///< its index in per_stage[wanted.stage], -1 when the schedule lacks it
};

/// The dependency of `action`, listed at stage `row` of a schedule with `stages` stages.
Dependency dependency_of(const Action& action, int row, int stages, bool lowered,
                         const ActionIndex& index);

/// Start and end on the stage; `ready` is when dependents may use the result (a SEND's ready is
/// the arrival of its data at the receiver).
struct Timing {
  double start = 0;
  double end = 0;
  double ready = 0;
};

/// Executes one action: `clock` is when the stage is free, `dep_ready` when its dependency is
/// ready (== clock when it has none).
using ExecuteFn = std::function<Timing(const Action& action, double clock, double dep_ready)>;

struct Replay {
  std::vector<std::vector<Timing>> timing;  ///< timing[r][i] of per_stage[r][i]
  bool deadlocked = false;                  ///< some stage could not proceed
  /// At the first deadlock: the index of each stage's next action (per_stage[r].size() when the
  /// stage had finished). Empty when there was no deadlock.
  std::vector<int> stuck_at;
};

/// Replays `schedule`. Stages are swept in ascending order, each running as far as it can; the
/// result does not depend on that order (times follow the dependency graph). With `force`, a
/// deadlock is broken by running the lowest unfinished stage's next action regardless of its
/// dependency, so a broken schedule can still be laid out. For each pair (a, b) of
/// `paired_updates`, the k-th OPT_STEP of stage a and that of stage b are a barrier between the
/// two stages (each starts once both stages have reached it), as when two stages exchange the
/// gradients of a tied parameter at every update.
Replay replay(const Schedule& schedule, const ExecuteFn& execute, bool force,
              std::span<const std::pair<int, int>> paired_updates = {});

/// Every action takes one time unit; dependents may start right after.
Timing unit_execute(const Action& action, double clock, double dep_ready);

}  // namespace actorpipe::internal
