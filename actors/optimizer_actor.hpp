// Optimizer-shard actor: runs the update protocol of one stage's OPT_STEP (tied gradients,
// gradient norm, clip scale, the optimizer update itself) and publishes the new weight version.
#pragma once

#include <caf/fwd.hpp>
#include <memory>

namespace actorpipe {

namespace internal {
struct RunState;
}

/// Spawns stage `stage`'s optimizer shard, detached (the update is compute). It owns the run's
/// use of the stage's OptimizerShard (the optimizer state) and a Context of the stage's thread
/// count. On `update` from its stage actor it takes the UpdateJob the stage handed out (the
/// stage keeps running its next actions meanwhile) and runs, per StageWorker's update protocol:
///   1. exchanges tied-gradient contributions with the other side's shard (tgrad) and sets the
///      sum (owner's + copy's) in the job;
///   2. job.finish_gradients() → Σg² per layer;
///   3. gets the clip scale: from the driver (sumsq → scale) when the mode clips globally, else
///      from its own sums (the tied parameter takes its owner's: the copy does not update it);
///   4. applies the update with its state (OptimizerShard::run_update), writing the new version;
///   5. follow_owner owner: publishes the tied weights of the new version to the copy's stage
///      (tweight);
/// then hands the job back with `published`, and the stage commits the version. Messages for
/// later updates may arrive early; they wait under their update ordinal.
caf::actor spawn_optimizer_actor(caf::actor_system& sys, std::shared_ptr<internal::RunState> state,
                                 int stage);

}  // namespace actorpipe
