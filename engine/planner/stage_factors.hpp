// Stage factors: what a mode's schedule asks of each stage per step — weight versions kept,
// microbatches stashed at the peak, optimizer updates — read off the generated schedule.
#pragma once

#include <vector>

#include "engine/expected.hpp"
#include "engine/mode.hpp"
#include "engine/schedule/schedule.hpp"

namespace actorpipe {

/// Per stage, from the schedule (engine/schedule/simulator.hpp: versions_kept, peak_stash).
struct StageFactors {
  int versions_kept = 1;     ///< weight versions alive at once (the one in use included)
  int peak_stash = 1;        ///< microbatches whose forward ran and backward not yet, at most
  int updates_per_step = 1;  ///< OPT_STEPs per m microbatches (pipedream: m, otherwise 1)
};

/// The schedule the planner reads a mode from: gpipe and 1f1b one step; 2bw and xpipe `steps`
/// steps of m microbatches; pipedream steps·m microbatches, each its own update.
/// Errors: the generator's (stages < 1, microbatches < 1, 2bw with m < d, steps < 1).
Expected<Schedule> planner_schedule(Mode mode, int stages, int microbatches, int steps);

/// Per stage factors of `mode` with d stages and m microbatches per step, from a schedule long
/// enough for the steady state: one step for gpipe and 1f1b, 2d steps for the asynchronous
/// modes (the slowest to settle, pipedream's stage 0, holds its d versions only after 2d - 2
/// microbatches). Nothing is hard-coded per mode: gpipe (versions 1, stash m), 1f1b
/// (1, min(d-r, m)), 2bw (2, d-r), pipedream (d-r, d-r) and xpipe (1, d-r) are what the
/// generators produce.
/// Errors: as planner_schedule.
Expected<std::vector<StageFactors>> stage_factors(Mode mode, int stages, int microbatches);

}  // namespace actorpipe
