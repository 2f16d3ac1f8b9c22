// Schedule as data: per-stage lists of actions (F, B, SEND/RECV, OPT_STEP, FLUSH) with their
// text form ("2F0", "1SEND_B3", "0OPT_STEP@1") and the stage x time grid of a unit-cost replay.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/expected.hpp"
#include "engine/mode.hpp"

namespace actorpipe {

/// What one action does at its stage.
///  F, B          forward / full backward of one microbatch.
///  SEND_F/RECV_F activation of a microbatch from stage r to stage r+1 (SEND_F at r, RECV_F at
///  r+1). SEND_B/RECV_B gradient of a microbatch from stage r to stage r-1 (SEND_B at r, RECV_B at
///  r-1).
///                Sends never block; a RECV blocks until the matching SEND has executed.
///  OPT_STEP      optimizer update of the stage's weights; `version` is the version it produces.
///  FLUSH         end-of-step barrier: the k-th FLUSH of a stage completes when every stage has
///                reached its k-th FLUSH; no microbatch may be in flight at the stage.
enum class ActionKind : uint8_t { F, B, SEND_F, RECV_F, SEND_B, RECV_B, OPT_STEP, FLUSH };

/// "F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "OPT_STEP", "FLUSH".
std::string_view to_string(ActionKind kind);

/// Parses a kind name (exact, upper case); false (out untouched) when unknown.
bool from_string(std::string_view name, ActionKind& out);

/// True for F and B.
bool is_compute(ActionKind kind);
/// True for SEND_F, RECV_F, SEND_B, RECV_B.
bool is_comm(ActionKind kind);

/// One step of one stage.
///
/// Text form (to_string / parse_action round-trip exactly):
///   <stage><KIND><microbatch>[@<version>][+<lookahead>]   for F, B, SEND_*, RECV_*
///   <stage>OPT_STEP@<version>                              for OPT_STEP
///   <stage>FLUSH                                           for FLUSH
/// "@<version>" is printed only when version != 0 (OPT_STEP always prints it), "+<lookahead>"
/// only when lookahead != 0. Examples: "2F0", "1SEND_B3", "3B17@2", "0F9+1", "0OPT_STEP@1".
struct Action {
  int stage = 0;
  ActionKind kind = ActionKind::F;
  /// Global microbatch index across all steps (step t has t*m .. t*m+m-1); -1 for OPT_STEP and
  /// FLUSH.
  int microbatch = -1;
  /// F/B: the weight version the action computes with (the number of OPT_STEPs of this stage
  /// whose result it sees; 2bw: max(t-1, 0) for step t, t-1 when continued; xpipe B: the latest
  /// version at the B). OPT_STEP: the version it produces. SEND/RECV: 0 (they are matched by stage
  /// and microbatch only).
  int version = 0;
  /// xpipe F only: s, the number of OPT_STEPs of this stage that land between this microbatch's
  /// F and its B. The F computes with weights predicted s updates ahead of `version`. 0 otherwise.
  int lookahead = 0;

  friend bool operator==(const Action&, const Action&) = default;
};

/// The text form described on Action.
std::string to_string(const Action& action);

/// Parses the text form; the error names the text and the expected shape.
Expected<Action> parse_action(std::string_view text);

/// Every stage's ordered action list plus the shape it was generated for.
struct Schedule {
  Mode mode = Mode::gpipe;
  int stages = 0;                              ///< d
  int microbatches = 0;                        ///< m per optimizer step (pipedream: 1)
  int steps = 1;                               ///< optimizer steps covered
  std::vector<std::vector<Action>> per_stage;  ///< per_stage[r]: stage r's actions, in order
  /// 2bw: the run continues an earlier run of the same training, so its step 0 computes with
  /// version -1, the version before the weights at run start (see make_2bw). False elsewhere.
  bool continued = false;

  /// microbatches * steps: the global microbatch indices are 0 .. total_microbatches()-1.
  int total_microbatches() const { return microbatches * steps; }

  friend bool operator==(const Schedule&, const Schedule&) = default;
};

/// True when the schedule contains any SEND/RECV (it has been lowered).
bool is_lowered(const Schedule& schedule);

/// The schedule without SEND/RECV actions (the compute-only form).
Schedule compute_only(const Schedule& schedule);

/// A run of `schedule` (an asynchronous mode's, over several steps) cut short after its first
/// `steps` steps: every stage's list without the actions of the later steps (F, B, SEND, RECV of
/// microbatches from steps·microbatches on, OPT_STEPs producing a version above `steps`), the
/// rest unchanged and in order, `steps` set. For every generator of this engine that is exactly
/// the schedule the generator makes for `steps` steps (tested for every mode and shape), so a
/// stage that has run only actions of those steps may take the shorter list where it stands.
/// Errors: `steps` outside [1, schedule.steps].
Expected<Schedule> first_steps(const Schedule& schedule, int steps);

/// Time slot of every action in a unit-cost replay (every action takes one slot; an F waits for
/// the previous stage's F (or, lowered, a RECV for its SEND), a B for the next stage's B, a FLUSH
/// for every stage's matching FLUSH). slots[r][i] belongs to per_stage[r][i]. The error describes
/// a deadlock; use validate() for a full diagnosis.
Expected<std::vector<std::vector<int>>> unit_slots(const Schedule& schedule);

/// How format_grid prints cells.
struct GridOptions {
  bool versions = false;  ///< print "@version" / "+lookahead" suffixes
  int mark_stage = -1;    ///< stage whose action `mark_index` is bracketed, with "<-- ERROR HERE"
  int mark_index = -1;    ///< index into per_stage[mark_stage]; -1 marks only the row
};

/// The stage x time grid: one row per stage, one column per time slot of the unit-cost replay,
/// blanks for idle slots. A schedule that deadlocks is laid out anyway (blocked actions are forced
/// in stage order), so the validator can show where it fails.
std::string format_grid(const Schedule& schedule, const GridOptions& options = {});

}  // namespace actorpipe
