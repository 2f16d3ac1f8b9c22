// Migration policy: the migration manager's decision rule — when the stages' busy times stay
// uneven, which partition the planner would choose instead, and whether the move pays for itself.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "engine/options.hpp"
#include "engine/planner/layer_costs.hpp"
#include "engine/planner/planner.hpp"

namespace actorpipe {

/// One check's verdict, with every number behind it (logged, put in the metrics and the trace).
struct MigrationDecision {
  long step = 0;               ///< optimizer updates done when the check was made
  std::vector<int> current;    ///< layers per stage now
  std::vector<double> busy;    ///< per stage, busy seconds per step over the window
  double imbalance = 0.0;      ///< max busy / mean busy - 1
  int imbalanced_checks = 0;   ///< consecutive checks above the threshold, this one included
  std::vector<double> speed;   ///< per stage speed factor given to the planner (1 = as profiled)
  std::vector<int> proposed;   ///< the planner's partition (empty: not asked)
  double predicted_now = 0.0;  ///< the planner's predicted step (s) of `current`, with `speed`
  double predicted_new = 0.0;  ///< ... of `proposed`
  int64_t bytes_to_move = 0;   ///< the moved layers' parameters and optimizer state
  double move_cost_seconds = 0.0;  ///< the move's estimated time
  bool move = false;               ///< move to `proposed` now
  std::string reason;              ///< one line: why (not)
};

/// The rule (docs/migration.md): every check gets each stage's busy seconds over the steps since
/// the last one. A check is imbalanced when max busy / mean busy - 1 > threshold. After
/// `patience` imbalanced checks in a row the planner plans again with the profiled layer costs,
/// each stage's compute scaled by its speed factor: measured busy / profiled busy, divided by
/// the smallest such factor (only relative speed matters: the fastest stage is 1); a stage whose
/// profiled busy is under a tenth of the mean keeps factor 1 (its measurement is mostly overhead),
/// and a factor within threshold of 1 counts as 1 (noise). The move happens when the plan differs
/// from the current partition, its predicted step is at least min_gain faster, and the time it
/// saves over check_every steps exceeds the move's estimated cost (bytes / the copy rate measured
/// by the previous move, 1 GB/s before any). A move, or a balanced check, resets the count.
class MigrationPolicy {
 public:
  /// `layers`: the profiled costs of every layer; `planner`: the options the planner plans with
  /// (mode, stages, microbatches, memory limit, split_backward); `bytes_per_layer`: each layer's
  /// state that a move copies (parameters, optimizer state, live versions).
  MigrationPolicy(const MigrationOptions& options, std::vector<LayerCosts> layers,
                  PlannerOptions planner, std::vector<int64_t> bytes_per_layer);

  /// A check after `steps` steps, busy_seconds[r] being stage r's busy seconds over them.
  Expected<MigrationDecision> check(long step, std::span<const int> current,
                                    std::span<const double> busy_seconds, int steps);
  /// A move of `bytes` took `seconds` (calibrates the cost estimate).
  void moved(int64_t bytes, double seconds);

 private:
  MigrationOptions o_;
  std::vector<LayerCosts> layers_;
  PlannerOptions planner_;
  std::vector<int64_t> bytes_per_layer_;
  int imbalanced_ = 0;
  double bytes_per_second_ = 1e9;
};

/// The bytes each layer's state takes in a move: parameters, optimizer state and the versions
/// `mode` keeps beyond the newest (its LayerCosts: parameter, optimizer and version bytes).
std::vector<int64_t> layer_move_bytes(std::span<const LayerCosts> layers, Mode mode);

}  // namespace actorpipe
