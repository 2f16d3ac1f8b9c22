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
///  in:  mb (driver), ann (neighbour stages), tweight (the tied owner's optimizer shard),
///       release (driver, after a FLUSH), published (its optimizer shard, after an OPT_STEP)
///  out: ann (neighbours), loss (last stage), credit (stage 0), flush, done, fail (driver),
///       update (its optimizer shard, which holds the worker until it answers published)
caf::actor spawn_stage_actor(caf::actor_system& sys, std::shared_ptr<internal::RunState> state,
                             int stage);

}  // namespace actorpipe
