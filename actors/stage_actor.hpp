// Stage actor: one pipeline stage as a detached actor. It runs its action list in order, each
// action as soon as its inputs (microbatch, activation, gradient, tied weights) have arrived.
#pragma once

#include <caf/fwd.hpp>
#include <memory>

namespace actorpipe {

namespace internal {
struct RunState;
}

/// Spawns stage `stage`'s actor, detached: it owns a thread that computes with the stage
/// worker's own Context. Messages (see actors/internal/messages.hpp):
///  in:  mb (driver), ann (neighbour stages), tweight (the tied owner's optimizer shard: a new
///       version; in xpipe also the owner's stage: a prediction its forward computed with),
///       published (its optimizer shard, after an OPT_STEP)
///  out: ann (neighbours), loss (last stage), credit (stage 0), done, fail (driver),
///       update (its optimizer shard: the worker's UpdateJob of an OPT_STEP), tweight (xpipe
///       owner: to the copy's stage)
/// At an OPT_STEP it hands the update's job to its shard and goes on with its next actions; it
/// commits the new version when the shard answers `published`. Only an action that needs that
/// version (StageWorker::waits_for_update), the next OPT_STEP, the start of the next schedule
/// repetition and the end of the run wait for the commit; in 2bw the next step's microbatches
/// thus compute on the current version while the shard writes the next one.
caf::actor spawn_stage_actor(caf::actor_system& sys, std::shared_ptr<internal::RunState> state,
                             int stage);

}  // namespace actorpipe
