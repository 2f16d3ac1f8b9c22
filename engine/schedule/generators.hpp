// Schedule generators for the five modes: pure functions from (stages, microbatches, steps) to
// per-stage action lists with the weight version of every forward and backward.
#pragma once

#include "engine/expected.hpp"
#include "engine/schedule/schedule.hpp"

namespace actorpipe {

/// GPipe, one step: every stage runs F of all m microbatches, then B in ascending microbatch order,
/// then OPT_STEP (producing version 1), then FLUSH. Every F and B uses version 0.
/// Errors: stages < 1, microbatches < 1.
Expected<Schedule> make_gpipe(int stages, int microbatches);

/// 1F1B (PipeDream-Flush), one step: stage r runs min(d-r-1, m) warm-up forwards, then alternates
/// one F and one B, then drains the remaining B (ascending), then OPT_STEP (version 1), FLUSH.
/// Errors: stages < 1, microbatches < 1.
Expected<Schedule> make_1f1b(int stages, int microbatches);

/// PipeDream-2BW over `steps` steps: the 1F1B order over all steps*m microbatches without a flush
/// in between (warm-up only in the first step, drain only at the end), an OPT_STEP after the last
/// B of each step at each stage, one FLUSH at the end. Versions count the updates since the run
/// started: version 0 is the weights at run start, the OPT_STEP after step t produces version
/// t+1. Every F and B of step t uses version t-1: a fresh training has no version -1, so its
/// first run (`continued` false) uses max(t-1, 0) (step 0 computes with the initial weights); a
/// run that continues an earlier one (`continued` true: a later run, a resume) uses version -1
/// in step 0, the version the earlier run's last step computed with, exactly as if both runs
/// were one. Sets Schedule::continued.
/// Errors: stages < 1, microbatches < stages (2BW needs m >= d), steps < 1.
Expected<Schedule> make_2bw(int stages, int microbatches, int steps, bool continued = false);

/// PipeDream (weight stashing) over `steps` microbatches, each its own optimizer step
/// (microbatches = 1): 1F1B with d-r-1 warm-up forwards at stage r and an OPT_STEP after every B,
/// one FLUSH at the end. An F uses the number of OPT_STEPs done at its stage before it; the B uses
/// the same version as its F. Errors: stages < 1, steps < 1.
Expected<Schedule> make_pipedream(int stages, int steps);

/// XPipe over `steps` steps: the action order of make_2bw (any m >= 1). An F records the current
/// version of its stage in `version` and in `lookahead` the number s of OPT_STEPs of its stage that
/// land between it and its B (it computes with weights predicted s updates ahead); a B uses the
/// latest version at its time (`version` = the F's version + s).
/// Errors: stages < 1, microbatches < 1, steps < 1.
Expected<Schedule> make_xpipe(int stages, int microbatches, int steps);

/// A forward-only pass (held-out evaluation), already lowered: stage r runs, for j = 0..k-1,
/// RECV_F j (r > 0), F j, SEND_F j (r < d-1). No B, OPT_STEP or FLUSH; every F at version 0 (the
/// weights the pass starts with). Not a training schedule: validate() is not for it.
/// Errors: stages < 1, microbatches < 1.
Expected<Schedule> make_forward_only(int stages, int microbatches);

/// The generator of `mode`. gpipe and 1f1b cover exactly one step (steps must be 1); pipedream
/// runs microbatches*steps microbatches, each its own step.
Expected<Schedule> make_schedule(Mode mode, int stages, int microbatches, int steps);

}  // namespace actorpipe
