// Pipeline prediction: per-stage costs from a layer profile and the simulator's steady-state
// step time measured as the benchmark measures (the balanced partition is the planner room's).
#include "bench/pipeline_prediction.hpp"

#include <algorithm>

#include "bench/step_timing.hpp"
#include "engine/execution/stage_worker.hpp"
#include "engine/schedule/generators.hpp"

namespace actorpipe::bench {

namespace {

Expected<Schedule> schedule_of(Mode mode, int stages, int microbatches, int steps) {
  if (mode == Mode::pipedream) return make_pipedream(stages, steps * microbatches);
  return make_schedule(mode, stages, microbatches, is_synchronous(mode) ? 1 : steps);
}

}  // namespace

Expected<double> simulated_step_seconds(Mode mode, int microbatches, const CostModel& costs,
                                        int warmup, int reps) {
  if (microbatches < 1 || warmup < 1 || reps < 1)
    return make_error("simulated step: microbatches = {}, warmup = {}, reps = {}: expected >= 1",
                      microbatches, warmup, reps);
  const int d = static_cast<int>(costs.forward.size());
  const int steps = warmup + reps;
  auto schedule = schedule_of(mode, d, microbatches, steps);
  if (!schedule) return schedule.error();
  if (is_synchronous(mode)) {
    CostModel no_update = costs;
    no_update.optimizer.clear();
    auto sim = simulate(*schedule, no_update);
    if (!sim) return sim.error();
    double slowest = 0.0;
    for (double o : costs.optimizer) slowest = std::max(slowest, o);
    return sim->makespan + slowest;
  }
  auto sim = simulate(*schedule, costs);
  if (!sim) return sim.error();
  // t_k: the end of the last stage's F of microbatch k*m - 1
  std::vector<double> loss_in(static_cast<size_t>(steps) + 1, -1.0);
  for (const TimedAction& t : sim->timeline) {
    const Action& a = t.action;
    if (a.stage != d - 1 || a.kind != ActionKind::F || (a.microbatch + 1) % microbatches != 0)
      continue;
    loss_in[static_cast<size_t>((a.microbatch + 1) / microbatches)] = t.end;
  }
  std::vector<double> periods;
  for (int k = warmup; k < steps; ++k) {
    const double t0 = loss_in[static_cast<size_t>(k)], t1 = loss_in[static_cast<size_t>(k) + 1];
    if (t0 < 0 || t1 < 0)
      return make_error("simulated step: step {} has no loss in the timeline", k);
    periods.push_back(t1 - t0);
  }
  return median(std::move(periods));
}

Expected<CostModel> stage_costs(const LayerProfile& profile, Mode mode, std::span<const int> counts,
                                int microbatches, int steps, bool split_backward) {
  const std::vector<int> per_stage(counts.begin(), counts.end());
  const int d = static_cast<int>(per_stage.size());
  std::vector<double> f, b, w, u, c, p;
  for (const LayerCost& l : profile.layers) {
    f.push_back(l.forward);
    b.push_back(l.backward);
    w.push_back(l.backward_weight);
    u.push_back(l.update);
    c.push_back(l.copy);
    p.push_back(l.predict);
  }
  auto F = sum_layers_per_stage(f, per_stage);
  if (!F) return F.error();
  auto B = sum_layers_per_stage(b, per_stage);
  auto W = sum_layers_per_stage(w, per_stage);
  auto U = sum_layers_per_stage(u, per_stage);
  auto C = sum_layers_per_stage(c, per_stage);
  auto P = sum_layers_per_stage(p, per_stage);
  auto schedule = schedule_of(mode, d, microbatches, steps);
  if (!schedule) return schedule.error();
  const std::vector<int> versions = versions_kept(*schedule);
  CostModel m;
  m.forward = *F;
  m.backward = *B;
  if (split_backward && d > 1) {
    m.backward_weight = *W;
    m.backward_weight[0] = 0.0;  // nothing waits for stage 0's input gradient
    for (int r = 1; r < d; ++r) {
      const size_t k = static_cast<size_t>(r);
      m.backward_weight[k] = std::min(m.backward_weight[k], m.backward[k]);
    }
  }
  m.optimizer = *U;
  if (profile.tied && d > 1 && tied_sync(mode) == TiedSync::exchange_grads)
    m.paired_updates.push_back({0, d - 1});
  for (int r = 0; r < d; ++r) {
    const size_t k = static_cast<size_t>(r);
    if (versions[k] > 1) m.optimizer[k] += (*C)[k];
    if (mode != Mode::xpipe) continue;
    int forwards = 0, predicting = 0;
    for (const Action& a : schedule->per_stage[k]) {
      if (a.kind != ActionKind::F) continue;
      ++forwards;
      if (a.lookahead > 0 && a.version > 0) ++predicting;
    }
    if (forwards > 0) m.forward[k] += (*P)[k] * predicting / forwards;
  }
  return m;
}

Expected<PipelinePrediction> predict_pipeline(const LayerProfile& profile, Mode mode,
                                              std::span<const int> counts, int microbatches,
                                              int warmup, int reps, bool split_backward) {
  auto costs = stage_costs(profile, mode, counts, microbatches, warmup + reps, split_backward);
  if (!costs) return costs.error();
  auto step = simulated_step_seconds(mode, microbatches, *costs, warmup, reps);
  if (!step) return step.error();
  return PipelinePrediction{std::move(*costs), *step};
}

}  // namespace actorpipe::bench
