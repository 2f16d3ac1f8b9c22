// Width × depth: every split of the job's processes into replicas of a pipeline, planned and
// ranked by the simulated step.
#include "engine/planner/width_depth.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace actorpipe {

std::string WidthDepthPlan::to_string() const {
  return fmt::format("w {} × d {}: [{}], predicted step {:.3f} s (all-reduce {:.3f} s)", replicas,
                     stages, fmt::join(plan.layers_per_stage, ", "), predicted_step_seconds,
                     allreduce_seconds);
}

Expected<WidthDepthResult> plan_width_depth(std::span<const LayerCosts> layers,
                                            const PlannerOptions& base, int ranks) {
  if (ranks < 1) return make_error("width × depth: {} processes, expected >= 1", ranks);
  const int n = static_cast<int>(layers.size());
  const int m = base.microbatches;
  WidthDepthResult out;
  for (int d = ranks; d >= 1; --d) {
    if (ranks % d != 0) continue;
    const int w = ranks / d;
    const std::string name = fmt::format("w {} × d {}", w, d);
    if (d > n) {
      out.skipped.push_back(fmt::format("{}: {} stages for {} layers", name, d, n));
      continue;
    }
    if (m % w != 0) {
      out.skipped.push_back(
          fmt::format("{}: pipeline.microbatches = {} is not a multiple of {}", name, m, w));
      continue;
    }
    if (w > 1 && (base.mode == Mode::pipedream || base.mode == Mode::xpipe)) {
      out.skipped.push_back(
          fmt::format("{}: mode {} runs no replicas", name, actorpipe::to_string(base.mode)));
      continue;
    }
    PlannerOptions o = base;
    o.stages = d;
    o.microbatches = m / w;
    o.replicas = w;
    o.layers_per_stage.clear();
    if (!o.stage_speed.empty()) o.stage_speed.resize(static_cast<size_t>(d), 1.0);
    auto planned = plan_partition(layers, o);
    if (!planned) {
      out.skipped.push_back(fmt::format("{}: {}", name, planned.error().message));
      continue;
    }
    WidthDepthPlan p;
    p.replicas = w;
    p.stages = d;
    p.plan = planned->plan;
    p.predicted_step_seconds = p.plan.predicted_step_seconds;
    for (const StagePlan& s : p.plan.stages)
      p.allreduce_seconds = std::max(p.allreduce_seconds, s.allreduce_seconds);
    out.ranked.push_back(std::move(p));
  }
  if (out.ranked.empty()) {
    return make_error("width × depth: no split of {} processes can run: {}", ranks,
                      fmt::join(out.skipped, "; "));
  }
  std::stable_sort(out.ranked.begin(), out.ranked.end(),
                   [](const WidthDepthPlan& a, const WidthDepthPlan& b) {
                     if (a.predicted_step_seconds != b.predicted_step_seconds)
                       return a.predicted_step_seconds < b.predicted_step_seconds;
                     return a.replicas < b.replicas;
                   });
  return out;
}

}  // namespace actorpipe
