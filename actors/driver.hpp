// Driver actor: feeds microbatches to the stages under a credit bound, gathers losses, combines
// the global gradient norm, releases flushes, reports progress and turns failures into errors.
#pragma once

#include <caf/fwd.hpp>
#include <memory>

namespace actorpipe {

namespace internal {
struct RunState;
}

/// Spawns the driver of one run on the cooperative scheduler. It answers one `run` request with
/// a RunOutcome once every stage has finished its list (ok, per-step losses) or the run failed
/// (error naming the stage, the microbatch and the cause). It:
///  - sends microbatch j to every stage (`mb`) while fewer than `credits` microbatches are past
///    the data loader and before stage 0's backward (each stage-0 backward returns a `credit`);
///  - gathers the last stage's `loss` per microbatch; a step's loss is (1/m)·Σⱼ meanⱼ in
///    microbatch order; calls on_step in step order with the stages' busy and idle times;
///  - in modes that clip globally, sums every stage's Σg² in stage then layer order and sends
///    each optimizer shard the clip scale (`scale`);
///  - on `fail`, a monitored actor going down, or no progress for stall_timeout_seconds, stops
///    every actor and answers the error.
caf::actor spawn_driver(caf::actor_system& sys, std::shared_ptr<internal::RunState> state);

}  // namespace actorpipe
