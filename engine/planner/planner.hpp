// Planner: cuts a model's layers into pipeline stages (and picks the layers to recompute) so the
// slowest stage is as fast as it can be under a per-stage memory limit; the simulator ranks it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "engine/mode.hpp"
#include "engine/planner/layer_costs.hpp"
#include "engine/planner/memory_model.hpp"

namespace actorpipe {

/// What the planner plans for.
struct PlannerOptions {
  Mode mode = Mode::onef1b;
  int stages = 1;        ///< d
  int microbatches = 1;  ///< m per optimizer step (pipedream: m microbatches, each an update)
  /// Per stage; 0 = no limit.
  std::int64_t memory_limit_bytes = 0;
  double bandwidth = 0.0;  ///< bytes per second of a link direction; 0 = infinite
  double latency = 0.0;    ///< seconds added to every transfer
  /// The asynchronous modes' simulated schedule spans this many steps (warm-up and drain
  /// included); the predicted step time is its makespan / steps.
  int steps = 4;
  /// Simulate with pipeline.split_backward: every stage but the first hands its input gradient
  /// on before the weight half of its backward (LayerCosts::backward_weight).
  bool split_backward = true;
  /// Per stage, how much longer its compute and update take than the layer costs say (1 = as
  /// measured; 2 = a stage on a core shared with another process). Transfers are not scaled.
  /// Empty = 1 for every stage; otherwise one finite factor > 0 per stage.
  std::vector<double> stage_speed;
  /// pipeline.replicas w: each stage's gradients are summed over w replicas before every update,
  /// which takes allreduce_latency + 2·(w−1)/w · the stage's gradient bytes / allreduce_bandwidth
  /// (what a member of GlooGroup::all_reduce_sum sends; 0 bandwidth = infinite). `microbatches`
  /// is then one replica's share of a step.
  int replicas = 1;
  double allreduce_bandwidth = 0.0;  ///< bytes per second one member sends; 0 = infinite
  double allreduce_latency = 0.0;    ///< seconds per all-reduce
  /// A fixed partition (layers per stage, one per stage): only the recompute flags are planned
  /// (pipeline.recompute = "auto" with an explicit partition); empty = plan the partition too.
  std::vector<int> layers_per_stage;
};

/// One stage of a plan. Times per microbatch unless named per step.
struct StagePlan {
  int first_layer = 0;             ///< global index of the stage's first layer
  int layers = 0;                  ///< how many it holds (>= 1)
  int recomputed = 0;              ///< how many of them are recomputed
  double compute_seconds = 0.0;    ///< Σ forward + Σ backward + Σ forward of recomputed layers
  double recompute_seconds = 0.0;  ///< the recomputed layers' forwards (part of compute)
  /// Its boundaries: the output it sends forward (unless last) and the gradient of its input it
  /// sends back (unless first), latency + bytes / bandwidth each.
  double transfer_seconds = 0.0;
  double update_seconds = 0.0;  ///< per step: Σ update · updates per step
  /// Per step: the gradient sums over the replicas (PlannerOptions::replicas), one per update.
  double allreduce_seconds = 0.0;
  /// Per step: m · (compute + transfer) + update + all-reduce; the plan minimises the largest.
  double step_seconds = 0.0;
  StageBytes bytes;  ///< the memory model's bytes with the plan's recompute flags
};

/// A partition with its recompute flags, what each stage costs, and the simulator's prediction.
struct PartitionPlan {
  std::vector<int> layers_per_stage;  ///< one count per stage, each >= 1
  std::vector<bool> recompute;        ///< per global layer
  std::vector<StagePlan> stages;
  double bottleneck_seconds = 0.0;  ///< the largest StagePlan::step_seconds
  int recomputed_layers = 0;        ///< Σ StagePlan::recomputed
  /// The mode's schedule simulated with the plan's stage costs (engine/schedule/simulator.hpp):
  /// one step's makespan for gpipe and 1f1b, the makespan of PlannerOptions::steps steps
  /// divided by steps for the asynchronous modes; and that simulation's bubble fraction.
  double predicted_step_seconds = 0.0;
  double predicted_bubble = 0.0;

  /// "[3, 3, 2] recompute {4, 5}: bottleneck 1.25 s, predicted step 9.5 s, bubble 0.210".
  std::string to_string() const;
};

/// The planner's plan, its runner-up and the simulator's ranking of the two.
struct PlannerResult {
  PartitionPlan plan;  ///< the best plan (see plan_partition for the order)
  /// The best plan whose layer counts differ from plan's (none when there is no other
  /// partition that fits, e.g. d = 1 or d = number of layers).
  std::optional<PartitionPlan> runner_up;
  /// plan and runner_up ordered by predicted step time (ties: the planner's order): the
  /// simulator's ranking of the top candidates, ranked[0] the one it predicts fastest.
  std::vector<PartitionPlan> ranked;
};

/// Plans `layers` (in model order) over options.stages stages. Every stage holds a contiguous,
/// non-empty run of layers; each layer may be recomputed (memory_model.hpp). A stage's time
/// per step is StagePlan::step_seconds with the mode's updates per step (stage_factors.hpp).
/// Plans are ordered by, in turn:
///   1. the bottleneck: the largest stage time (smaller first), among plans whose every stage
///      fits the memory limit;
///   2. the number of recomputed layers (fewer first);
///   3. the partition: the shorter last stage first, then the shorter stage before it, and so
///      on (layers go early; the rule of balanced_partition);
///   4. per stage, first to last: the smaller stage time, then the fewer activation bytes, then
///      the recompute flags in layer order, not recomputing before recomputing (the later
///      layers are recomputed first).
/// The result is the first plan in that order, the first one with other layer counts, and the
/// simulator's ranking of the two. The dynamic program is exact: it equals enumerating every
/// partition and every recompute choice (when the sums of times are exact, e.g. integers).
/// Errors: no layers; stages < 1 or more stages than layers; microbatches or steps < 1; a
/// negative memory limit; a negative or non-finite bandwidth or latency; a bad layer cost
/// (check_layer_costs); the mode's schedule (2bw with microbatches < stages); and a limit no
/// plan fits, naming for the best attempt (the partition whose largest stage, every layer
/// recomputed that saves memory, is smallest) that stage, its bytes by kind and the limit.
/// With options.layers_per_stage the partition is that one (no runner-up): the plan is its
/// fastest recompute choice per stage in the same order; errors also name counts that are not
/// one positive count per stage summing to the layers, and a limit the partition cannot fit
/// (its largest stage, every layer recomputed that saves memory, its bytes and the limit).
Expected<PlannerResult> plan_partition(std::span<const LayerCosts> layers,
                                       const PlannerOptions& options);

/// The plan of the fixed partition `counts`: plan_partition with PlannerOptions::layers_per_stage
/// = counts, its plan (recompute choice, stage costs, the simulator's prediction). Errors are
/// plan_partition's: counts that are not a partition of the layers over options.stages stages,
/// a partition that does not fit the memory limit.
Expected<PartitionPlan> plan_fixed_partition(std::span<const LayerCosts> layers,
                                             const PlannerOptions& options,
                                             std::span<const int> counts);

}  // namespace actorpipe
