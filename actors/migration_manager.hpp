// Migration manager: one actor per job (per ActorEngine) that receives every stage's busy and
// idle time after each optimizer step and, at the boundaries the engine stops at, decides — by
// a forced move of migration.moves or by the MigrationPolicy rule — and runs the move.
#pragma once

#include <caf/fwd.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "actors/actor_engine.hpp"
#include "engine/config/forced_moves.hpp"
#include "engine/expected.hpp"
#include "engine/migration/layer_move.hpp"
#include "engine/migration/migration_policy.hpp"

namespace actorpipe {

/// The automatic rule's verdict at a check step, during a run: one to report now, or a decision
/// to move (made at the segment's end; the engine cuts the run short).
struct MigrationCheck {
  bool report = false;
  bool move = false;
  MigrationEvent event;
};

/// Hands the manager's check verdicts to the thread that asked: the driver's, which in a job of
/// several processes runs in another actor system than the manager, so it waits here and not as
/// a CAF actor of the manager's system.
class MigrationCheckReplies {
 public:
  /// The manager's answer.
  void put(MigrationCheck verdict);
  /// Waits for the answer to the check just asked; an error after `timeout`.
  Expected<MigrationCheck> take(std::chrono::milliseconds timeout);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<MigrationCheck> verdict_;
};

/// What the manager works with (in a job of several processes only the driver's rank has the
/// policy: the others follow its verdicts). It outlives the manager; only the manager's thread
/// touches it while the manager runs (but for `replies`, which is thread-safe).
struct MigrationManagerSetup {
  std::vector<ForcedMove> forced;           ///< migration.moves
  std::unique_ptr<MigrationPolicy> policy;  ///< migration.enabled: the rule; null = forced only
  int check_every = 10;                     ///< migration.check_every
  /// Runs a move to the given layer counts (the engine's stages, idle at a boundary).
  std::function<Expected<MoveReport>(const std::vector<int>& counts)> move;
  /// The verdicts of checks (check_atom), for the engine.
  MigrationCheckReplies replies;
};

/// Runs setup.move to `to` and fills in `event` with what it did (moved, to, layers and bytes
/// moved, its seconds) or why it failed (error); a policy learns the move's copy rate. Only
/// while the stages are idle and the manager handles no message.
void move_and_report(MigrationManagerSetup& setup, const std::vector<int>& to,
                     MigrationEvent& event);

/// After `step` updates, the step at which the engine ends its next segment for the manager (the
/// next forced move's step), at most `limit`. Checks of the automatic rule do not end segments:
/// they run while the pipeline does, and a check that decides to move cuts the run short.
long next_migration_boundary(const MigrationManagerSetup& setup, long step, long limit);

/// Spawns the manager in `sys`. Its messages (actors/internal/messages.hpp): the stages'
/// cumulative times after each step of a segment, a segment's start; at a check step, during the
/// run, a request for the rule's verdict (→ one to report now, or a decision to move, which it
/// keeps); and at a segment's end a request for the move due there (a forced one, or the kept
/// decision: → the MigrationEvent, after making the move, or none).
caf::actor spawn_migration_manager(caf::actor_system& sys,
                                   std::shared_ptr<MigrationManagerSetup> setup);

}  // namespace actorpipe
