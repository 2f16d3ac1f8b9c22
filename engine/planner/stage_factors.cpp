// Stage factors: generates the mode's schedule and reads versions kept, peak stash and the
// number of optimizer updates per step of every stage off it.
#include "engine/planner/stage_factors.hpp"

#include <algorithm>

#include "engine/schedule/generators.hpp"
#include "engine/schedule/simulator.hpp"

namespace actorpipe {

Expected<Schedule> planner_schedule(Mode mode, int stages, int microbatches, int steps) {
  if (steps < 1) return make_error("steps = {} is not allowed: it must be >= 1", steps);
  if (mode == Mode::pipedream) {
    if (microbatches < 1) {
      return make_error("microbatches = {} is not allowed: it must be >= 1", microbatches);
    }
    return make_pipedream(stages, steps * microbatches);
  }
  return make_schedule(mode, stages, microbatches, is_synchronous(mode) ? 1 : steps);
}

Expected<std::vector<StageFactors>> stage_factors(Mode mode, int stages, int microbatches) {
  const int steps = is_synchronous(mode) ? 1 : 2 * std::max(stages, 1);
  auto schedule = planner_schedule(mode, stages, microbatches, steps);
  if (!schedule) return schedule.error();
  const std::vector<int> versions = versions_kept(*schedule);
  const std::vector<int> stash = peak_stash(*schedule);
  std::vector<StageFactors> out;
  for (size_t r = 0; r < schedule->per_stage.size(); ++r) {
    int updates = 0;
    for (const Action& a : schedule->per_stage[r]) {
      if (a.kind == ActionKind::OPT_STEP) ++updates;
    }
    out.push_back({versions[r], stash[r], updates / steps});
  }
  return out;
}

}  // namespace actorpipe
