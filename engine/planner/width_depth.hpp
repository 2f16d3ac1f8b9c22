// Width × depth: how a job of R processes is best split into w data-parallel replicas of a
// d-stage pipeline (w·d = R), each split planned and simulated with the all-reduce's cost.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "engine/planner/layer_costs.hpp"
#include "engine/planner/planner.hpp"

namespace actorpipe {

/// One split of the job: w replicas of a d-stage pipeline, one stage per process.
struct WidthDepthPlan {
  int replicas = 1;  ///< w
  int stages = 1;    ///< d
  /// One replica's pipeline: the planner's best plan of d stages for m/w microbatches a step,
  /// with each update's all-reduce over w replicas in its stage costs and its simulation.
  PartitionPlan plan;
  /// The job's step: plan.predicted_step_seconds (every replica runs the same step).
  double predicted_step_seconds = 0.0;
  /// Per step, the largest stage's all-reduce time (0 for w = 1).
  double allreduce_seconds = 0.0;
  /// "w 2 × d 1: [8], predicted step 1.234 s (all-reduce 0.120 s)".
  std::string to_string() const;
};

/// Every split that can run, fastest predicted step first, and those that cannot.
struct WidthDepthResult {
  std::vector<WidthDepthPlan> ranked;  ///< ties: fewer replicas first
  /// One line per split left out and why ("w 4 × d 1: pipeline.microbatches = 6 is not a
  /// multiple of 4").
  std::vector<std::string> skipped;
};

/// Plans every w·d = `ranks` split (d from `ranks` down to 1) of a job whose step has
/// `base.microbatches` microbatches in all, with plan_partition(layers, base with stages = d,
/// microbatches = m/w, replicas = w). base's mode, memory limit, link, all-reduce bandwidth
/// and latency and steps apply to every split; base.stages, base.replicas and
/// base.layers_per_stage are ignored, and base.stage_speed is cut or padded with 1 to d. A split is
/// left out (with its reason) when d exceeds the layers, w does not divide m, the mode cannot run
/// replicas (pipedream, xpipe) or no plan of it fits (2bw with m/w < d, the memory limit). Errors:
/// ranks < 1, and no split can run (the reasons of each).
Expected<WidthDepthResult> plan_width_depth(std::span<const LayerCosts> layers,
                                            const PlannerOptions& base, int ranks);

}  // namespace actorpipe
