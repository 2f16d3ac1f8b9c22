// Schedule validator: rejects malformed action lists, missing or duplicate F/B, B before F,
// unmatched SEND/RECV and deadlock (by a deterministic replay), showing the grid with the mark.
#pragma once

#include "engine/expected.hpp"
#include "engine/schedule/schedule.hpp"

namespace actorpipe {

/// Checks, in this order, and reports the first failure:
///  1. shape: stages >= 1 and one action list per stage, microbatches >= 1, steps >= 1;
///  2. every action: its `stage` is the list it is in, its microbatch is in
///     [0, total_microbatches()) (-1 for OPT_STEP/FLUSH), a send/receive has a neighbour in its
///     direction (no SEND_F/RECV_B at the last stage, no RECV_F/SEND_B at the first);
///  3. lowered schedules: every SEND has its matching RECV on the neighbour stage and vice versa;
///  4. per stage, in order: no duplicate action, no B before its F, (lowered) every F/B after its
///     RECV and every SEND after its F/B, OPT_STEP versions 1, 2, 3, ..., no microbatch in flight
///     at a FLUSH;
///  5. every microbatch has exactly one F and one B at every stage (lowered: and is sent on);
///  6. no deadlock: a replay where each stage runs its list in order, an F waits for the previous
///     stage's F (lowered: a RECV waits for its SEND), a B for the next stage's B, and the k-th
///     FLUSH for every stage's k-th FLUSH, must finish.
/// The error message says what is wrong on its first line (stage, index, action text), followed
/// by the stage x time grid with the failing action in brackets and "<-- ERROR HERE" on its row.
Status validate(const Schedule& schedule);

}  // namespace actorpipe
