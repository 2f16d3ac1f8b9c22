// Migration policy: the decision rule of migration_policy.hpp, in the order the docs give it.
#include "engine/migration/migration_policy.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace actorpipe {
namespace {

// Per layer, the stage holding it.
std::vector<int> stage_of_layers(std::span<const int> counts) {
  std::vector<int> out;
  for (size_t r = 0; r < counts.size(); ++r) out.insert(out.end(), counts[r], static_cast<int>(r));
  return out;
}

}  // namespace

std::vector<int64_t> layer_move_bytes(std::span<const LayerCosts> layers, Mode mode) {
  std::vector<int64_t> out;
  // between runs only 2bw keeps an older version (its previous one) beside the newest
  const int64_t extra = mode == Mode::twobw ? 1 : 0;
  for (const LayerCosts& l : layers)
    out.push_back(l.parameter_bytes + l.optimizer_bytes + extra * l.version_bytes);
  return out;
}

MigrationPolicy::MigrationPolicy(const MigrationOptions& options, std::vector<LayerCosts> layers,
                                 PlannerOptions planner, std::vector<int64_t> bytes_per_layer)
    : o_(options),
      layers_(std::move(layers)),
      planner_(std::move(planner)),
      bytes_per_layer_(std::move(bytes_per_layer)) {
  planner_.stage_speed.clear();
  planner_.layers_per_stage.clear();  // the manager plans the partition
}

void MigrationPolicy::moved(int64_t bytes, double seconds) {
  if (bytes > 0 && seconds > 0) bytes_per_second_ = static_cast<double>(bytes) / seconds;
  imbalanced_ = 0;
}

Expected<MigrationDecision> MigrationPolicy::check(long step, std::span<const int> current,
                                                   std::span<const double> busy_seconds,
                                                   int steps) {
  const int d = static_cast<int>(current.size());
  if (d != planner_.stages || static_cast<int>(busy_seconds.size()) != d || steps < 1) {
    return make_error(
        "migration check: {} stage counts and {} busy times for {} stages over {} "
        "steps",
        current.size(), busy_seconds.size(), planner_.stages, steps);
  }
  MigrationDecision out;
  out.step = step;
  out.current.assign(current.begin(), current.end());
  for (double b : busy_seconds) out.busy.push_back(b / steps);
  const double mean = std::accumulate(out.busy.begin(), out.busy.end(), 0.0) / d;
  const double most = *std::max_element(out.busy.begin(), out.busy.end());
  out.imbalance = mean > 0 ? most / mean - 1.0 : 0.0;
  if (d < 2 || !(out.imbalance > o_.threshold)) {
    imbalanced_ = 0;
    out.reason =
        fmt::format("balanced: imbalance {:.3f} <= threshold {:.3f}", out.imbalance, o_.threshold);
    return out;
  }
  out.imbalanced_checks = ++imbalanced_;
  if (imbalanced_ < o_.patience) {
    out.reason = fmt::format("imbalance {:.3f} > threshold {:.3f}: check {} of {}", out.imbalance,
                             o_.threshold, imbalanced_, o_.patience);
    return out;
  }

  // each stage's speed relative to the profile
  PlannerOptions plain = planner_;
  auto now_plain = plan_fixed_partition(layers_, plain, current);
  if (!now_plain) return now_plain.error();
  std::vector<double> profiled;  // per stage: compute + update per step, as profiled
  for (const StagePlan& s : now_plain->stages)
    profiled.push_back(plain.microbatches * s.compute_seconds + s.update_seconds);
  const double mean_profiled = std::accumulate(profiled.begin(), profiled.end(), 0.0) / d;
  std::vector<double> raw(static_cast<size_t>(d), 0.0), trusted;
  for (int r = 0; r < d; ++r) {
    if (profiled[r] >= 0.1 * mean_profiled && profiled[r] > 0 && out.busy[r] > 0) {
      raw[r] = out.busy[r] / profiled[r];
      trusted.push_back(raw[r]);
    }
  }
  const double norm = trusted.empty() ? 1.0 : *std::min_element(trusted.begin(), trusted.end());
  for (int r = 0; r < d; ++r) {
    double k = raw[r] > 0 ? raw[r] / norm : 1.0;
    if (std::abs(k - 1.0) <= o_.threshold) k = 1.0;
    out.speed.push_back(k);
  }
  PlannerOptions scaled = planner_;
  scaled.stage_speed = out.speed;
  auto plan = plan_partition(layers_, scaled);
  if (!plan) return plan.error();
  auto now = plan_fixed_partition(layers_, scaled, current);
  if (!now) return now.error();
  // the simulator's pick of the planner's top two
  const PartitionPlan& best = plan->ranked.front();
  out.proposed = best.layers_per_stage;
  out.predicted_now = now->predicted_step_seconds;
  out.predicted_new = best.predicted_step_seconds;
  const std::vector<int> old_stage = stage_of_layers(current);
  const std::vector<int> new_stage = stage_of_layers(out.proposed);
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (old_stage[l] != new_stage[l]) out.bytes_to_move += bytes_per_layer_[l];
  }
  out.move_cost_seconds = static_cast<double>(out.bytes_to_move) / bytes_per_second_;
  const double gain = out.predicted_now - out.predicted_new;
  if (out.proposed == out.current) {
    out.reason = fmt::format(
        "imbalance {:.3f} for {} checks, but the planner keeps [{}] (stage speeds [{:.2f}])",
        out.imbalance, imbalanced_, fmt::join(out.current, ", "), fmt::join(out.speed, ", "));
    imbalanced_ = 0;
    return out;
  }
  if (!(gain >= o_.min_gain * out.predicted_now)) {
    out.reason = fmt::format(
        "[{}] would take {:.4g} s per step instead of {:.4g} s: under min_gain {:.3f}",
        fmt::join(out.proposed, ", "), out.predicted_new, out.predicted_now, o_.min_gain);
    imbalanced_ = 0;
    return out;
  }
  if (!(gain * o_.check_every > out.move_cost_seconds)) {
    out.reason =
        fmt::format("[{}] saves {:.4g} s over {} steps, less than the move's {:.4g} s ({} bytes)",
                    fmt::join(out.proposed, ", "), gain * o_.check_every, o_.check_every,
                    out.move_cost_seconds, out.bytes_to_move);
    imbalanced_ = 0;
    return out;
  }
  out.move = true;
  out.reason = fmt::format(
      "imbalance {:.3f} > {:.3f} for {} checks: [{}] -> [{}], predicted step {:.4g} s -> {:.4g} s, "
      "stage speeds [{:.2f}], {} bytes to move (about {:.3g} s)",
      out.imbalance, o_.threshold, imbalanced_, fmt::join(out.current, ", "),
      fmt::join(out.proposed, ", "), out.predicted_now, out.predicted_new,
      fmt::join(out.speed, ", "), out.bytes_to_move, out.move_cost_seconds);
  return out;
}

}  // namespace actorpipe
