// Lowering: adds the communication actions (SEND_F/RECV_F, SEND_B/RECV_B) to a compute-only
// schedule. A pure function; the result replays exactly like its input.
#pragma once

#include "engine/expected.hpp"
#include "engine/schedule/schedule.hpp"

namespace actorpipe {

/// Adds, at every stage r of d:
///   RECV_F right before each F (r > 0),  SEND_F right after each F (r < d-1),
///   RECV_B right before each B (r < d-1), SEND_B right after each B (r > 0).
/// Sends never block and every receive sits right before the action that consumes it, so a
/// compute-only schedule that replays without deadlock lowers to one that does too.
/// Errors: the schedule already contains communication actions.
Expected<Schedule> lower(const Schedule& schedule);

}  // namespace actorpipe
