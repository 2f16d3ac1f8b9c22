// Pipeline prediction: the simulator's step time for one benchmark configuration, from a layer
// profile (and the planner's balanced partition), timed the way the benchmark times the engine.
#pragma once

#include <span>
#include <vector>

#include "bench/layer_profile.hpp"
#include "engine/expected.hpp"
#include "engine/mode.hpp"
#include "engine/planner/balanced_partition.hpp"
#include "engine/schedule/simulator.hpp"

namespace actorpipe::bench {

/// The balanced partition of engine/planner/balanced_partition.hpp (moved there from here).
using actorpipe::balanced_partition;

/// The simulator's time of one optimizer step (m microbatches) in the steady state, taken as the
/// benchmark takes it from the actor engine: t_k is when the loss of step k's last microbatch is
/// in (the end of its F at the last stage), k = 1 .. warmup+reps, and the step time is the median
/// of t_{k+1} - t_k for k >= warmup.
///  - gpipe, 1f1b: a step is one schedule repeated after its FLUSH, and every stage's OPT_STEP
///    waits for the step's last backward at every stage (global clipping, the tied-gradient
///    exchange), so a step takes the makespan of the schedule without updates plus the slowest
///    stage's update.
///  - 2bw, xpipe: one schedule of warmup+reps steps; pipedream: (warmup+reps)·m microbatches,
///    each its own step, and t_k after every m-th.
/// Errors: m < 1, warmup < 1, reps < 1, costs the simulator rejects.
Expected<double> simulated_step_seconds(Mode mode, int microbatches, const CostModel& costs,
                                        int warmup, int reps);

/// Per-stage costs from a profile: forward and backward sum the stage's layers; the optimizer
/// sums their updates plus, where the mode keeps more than one weight version at the stage
/// (versions_kept of its schedule: 2bw, pipedream before the last stage), a copy of the
/// parameters; xpipe adds to the forward the prediction cost times the share of the stage's
/// forwards that predict (lookahead > 0 after the first update). Transfers are free (in-process
/// hand-off, no copy). With a tied model whose embedding (stage 0) and head (last stage) sit on
/// different stages, modes that exchange the tied gradients (tied_sync: gpipe, 1f1b) pair
/// those two stages' updates (CostModel::paired_updates): each waits for the other's. With
/// `split_backward` (the engine's pipeline.split_backward), every stage but the first hands its
/// input gradient on before the weight half of its B: backward_weight sums the stage's layers'.
Expected<CostModel> stage_costs(const LayerProfile& profile, Mode mode, std::span<const int> counts,
                                int microbatches, int steps, bool split_backward = true);

struct PipelinePrediction {
  CostModel costs;
  double step_seconds = 0.0;
};

/// stage_costs then simulated_step_seconds for `counts` (one entry per stage).
Expected<PipelinePrediction> predict_pipeline(const LayerProfile& profile, Mode mode,
                                              std::span<const int> counts, int microbatches,
                                              int warmup, int reps, bool split_backward = true);

}  // namespace actorpipe::bench
