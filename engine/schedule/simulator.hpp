// Simulator: replays a schedule with a cost model (F/B/optimizer time per stage, activation bytes
// per boundary, link latency and bandwidth) into a timeline, makespan, bubble and memory figures.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/expected.hpp"
#include "engine/schedule/schedule.hpp"

namespace actorpipe {

/// Costs in seconds and bytes; "per stage" vectors have one entry per stage.
struct CostModel {
  std::vector<double> forward;   ///< F time of one microbatch, per stage
  std::vector<double> backward;  ///< B time of one microbatch, per stage
  /// Per stage: the part of `backward` that comes after the stage's input gradient is ready
  /// (pipeline.split_backward: the weight gradients of a split B). A SEND_B that directly
  /// follows its B is issued that much before the B ends. Empty = 0 (B sends at its end).
  std::vector<double> backward_weight;
  std::vector<double> optimizer;  ///< OPT_STEP time per stage; empty = 0
  /// Per stage: the sum of the stage's gradients over the data-parallel replicas
  /// (pipeline.replicas), which every OPT_STEP of the stage runs before its update: the
  /// OPT_STEP takes optimizer + allreduce. Empty = 0 (one replica).
  std::vector<double> allreduce;
  std::vector<double> activation_bytes;  ///< bytes crossing boundary r -> r+1 (d-1 entries; the
                                         ///< gradient going back has the same size); empty = 0
  double latency = 0;                    ///< seconds added to every transfer
  double bandwidth = 0;                  ///< bytes per second of each link direction; 0 = infinite
  /// Pairs of stages whose k-th OPT_STEPs wait for each other (a tied parameter held by both
  /// that keeps its copies equal by exchanging gradients: tied_sync's exchange_grads); empty =
  /// none.
  std::vector<std::pair<int, int>> paired_updates;
};

/// forward = f and backward = b at every stage, everything else free.
CostModel uniform_costs(int stages, double f, double b);

/// Sums per-layer times into per-stage times: stage r gets layers_per_stage[r] consecutive layers.
/// Errors: the counts do not add up to the number of layers, or one is < 1.
Expected<std::vector<double>> sum_layers_per_stage(const std::vector<double>& per_layer,
                                                   const std::vector<int>& layers_per_stage);

/// One action's place in time. F, B and OPT_STEP occupy their stage from start to end. A RECV
/// spans the stage's wait for the data (start = when the stage reached it, end = arrival). A SEND
/// does not occupy its stage: start = when it was issued, end = when its data arrived.
struct TimedAction {
  Action action;
  double start = 0;
  double end = 0;
};

struct Simulation {
  std::vector<TimedAction> timeline;  ///< every action of the lowered schedule, by (start, stage)
  double makespan = 0;                ///< the last end
  std::vector<double> busy;           ///< per stage: time in F, B and OPT_STEP
  double bubble_fraction = 0;         ///< (d * makespan - sum(busy)) / (d * makespan)
  std::vector<int> peak_stash;        ///< per stage: max microbatches whose F ran, B not yet
  std::vector<int> versions_kept;     ///< per stage: max weight versions alive at once
};

/// Replays `schedule` (lowered first when it is compute-only). Every stage runs its list in
/// order; an F/B starts when the stage is free and its input has arrived. A B's result is ready
/// backward_weight before its end. A transfer starts
/// when the SEND is issued and the link (one per direction per boundary, FIFO) is free, holds
/// the link for bytes/bandwidth and arrives latency later. A FLUSH is a barrier (zero time).
/// Errors: the schedule does not validate, a cost vector has the wrong length or a negative
/// or non-finite entry, or a stage's backward_weight exceeds its backward.
Expected<Simulation> simulate(const Schedule& schedule, const CostModel& costs);

/// Per stage: the most microbatches stashed at once (F done, B not yet), from the action order.
std::vector<int> peak_stash(const Schedule& schedule);

/// Per stage: the most weight versions alive at once, from the action order. Alive after each
/// action: the latest version (from the last OPT_STEP) and every version a microbatch in flight
/// will still use for its B, when that version is not newer than the latest (an xpipe B uses
/// weights that do not exist yet at its F, so it pins nothing). gpipe/1f1b: 1, 2bw: 2,
/// pipedream: d-r at stage r, xpipe: 1.
std::vector<int> versions_kept(const Schedule& schedule);

/// The timeline as text: one line per action, "start end stage action".
std::string format_timeline(const Simulation& simulation);

}  // namespace actorpipe
