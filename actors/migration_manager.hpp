// Migration manager: one actor per job (per ActorEngine) that receives every stage's busy and
// idle time after each optimizer step and, at the boundaries the engine stops at, decides — by
// a forced move of migration.moves or by the MigrationPolicy rule — and runs the move.
#pragma once

#include <caf/fwd.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "actors/actor_engine.hpp"
#include "engine/config/forced_moves.hpp"
#include "engine/expected.hpp"
#include "engine/migration/layer_move.hpp"
#include "engine/migration/migration_policy.hpp"

namespace actorpipe {

/// What the manager works with. It outlives the manager; only the manager's thread touches it
/// while the manager runs.
struct MigrationManagerSetup {
  std::vector<ForcedMove> forced;           ///< migration.moves
  std::unique_ptr<MigrationPolicy> policy;  ///< migration.enabled: the rule; null = forced only
  int check_every = 10;                     ///< migration.check_every
  /// migration.enabled: the engine stops every check_every steps (in a job of several
  /// processes, only the lead rank holds the policy; every rank stops alike)
  bool checks = false;
  /// Runs a move to the given layer counts (the engine's stages, idle at a boundary).
  std::function<Expected<MoveReport>(const std::vector<int>& counts)> move;
};

/// Runs setup.move to `to` and fills in `event` with what it did (moved, to, layers and bytes
/// moved, its seconds) or why it failed (error); a policy learns the move's copy rate. Only
/// while the stages are idle and the manager handles no message.
void move_and_report(MigrationManagerSetup& setup, const std::vector<int>& to,
                     MigrationEvent& event);

/// The manager's part at a boundary: after `step` updates with `counts` layers per stage, the
/// step at which the engine stops next for the manager (a forced move's step or the next check),
/// at most `limit`.
long next_migration_boundary(const MigrationManagerSetup& setup, long step, long limit);

/// Spawns the manager in `sys`. Its messages (actors/internal/migration_messages.hpp): the
/// stages' cumulative times after each step of a segment, a segment's start, and at a boundary
/// a request for its verdict (→ a MigrationEvent, or none when nothing was due), which it gives
/// after running the move it decided on.
caf::actor spawn_migration_manager(caf::actor_system& sys,
                                   std::shared_ptr<MigrationManagerSetup> setup);

}  // namespace actorpipe
