// Trace: executed actions as a Chrome / Perfetto trace (JSON trace event format) with one track
// per stage and one span per action, named by the action's text form ("2F0", "1B3@1").
#pragma once

#include <span>
#include <string>

#include "engine/expected.hpp"
#include "engine/schedule/schedule.hpp"

namespace actorpipe {

/// One executed action: its stage, the action, and its start and end in seconds since the
/// trainer started training. `update`: not the stage's own action but the update its optimizer
/// shard ran for that OPT_STEP, from the stage's hand-off to the new version's hand-back.
/// `eval`: an action of a held-out evaluation (its microbatch is a held-out one).
struct TraceSpan {
  int stage = 0;
  Action action;
  double start = 0.0;
  double end = 0.0;
  bool update = false;
  bool eval = false;
  /// A sum of the stage's gradients over the replicas (ReduceSpan): on the optimizer's track,
  /// named "allreduce <step>", category "allreduce"; action.version is the step.
  bool allreduce = false;
};

/// A moment of the whole pipeline (a migration, an evaluation's result): an instant event across
/// every track.
struct TraceMark {
  double at = 0.0;                     ///< seconds since the trainer started training
  std::string name;                    ///< "migration [1, 7] -> [4, 4]"
  std::string detail;                  ///< one line (the manager's reason)
  std::string category = "migration";  ///< "migration", or "eval" (an evaluation's loss)
};

/// The trace as JSON: {"displayTimeUnit":"ms","traceEvents":[...]} with, for each stage r of
/// `stages`, metadata naming thread r "stage r" and thread stages + r "stage r optimizer"
/// (sorted stage 0, its optimizer, stage 1, ...) in process 1 "actorpipe", then one complete
/// event ("ph":"X") per span: name = to_string(action) ("eval 1F3" for an evaluation's), cat =
/// its kind ("F", "B", "OPT_STEP", ...), "update" for an update span or "eval" for an
/// evaluation's, tid = stage (update spans: stages + stage), ts and dur in
/// microseconds, args = microbatch and version.
/// Each mark is a global instant event ("ph":"i","s":"g") named by its name, cat = its category
/// ("migration", "eval"), args = detail.
std::string chrome_trace_json(std::span<const TraceSpan> spans, int stages,
                              std::span<const TraceMark> marks = {});

/// Writes chrome_trace_json to `path` (load it in ui.perfetto.dev or chrome://tracing). Errors
/// name the path and the system's reason.
Status write_chrome_trace(const std::string& path, std::span<const TraceSpan> spans, int stages,
                          std::span<const TraceMark> marks = {});

}  // namespace actorpipe
