// Planner: a Pareto frontier of recompute choices per layer range, then dynamic programs over
// the stage cuts (the smallest bottleneck, then the fewest recomputed layers, then the cuts).
#include "engine/planner/planner.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <limits>
#include <map>

#include "engine/planner/stage_factors.hpp"
#include "engine/schedule/simulator.hpp"

namespace actorpipe {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One recompute choice of a range's layers.
struct Choice {
  double extra = 0.0;       // Σ forward of the recomputed layers, in layer order
  std::int64_t saved = 0;   // Σ recompute_saving of the recomputed layers
  int count = 0;            // recomputed layers
  std::vector<bool> flags;  // one per layer of the range
};

// The order among choices that fit equally: fewer recomputed, faster, fewer bytes, flags.
bool choice_before(const Choice& a, const Choice& b) {
  if (a.count != b.count) return a.count < b.count;
  if (a.extra != b.extra) return a.extra < b.extra;
  if (a.saved != b.saved) return a.saved > b.saved;
  return a.flags < b.flags;
}

// Keeps the choices no other choice dominates (as few recomputed, as fast, saving as much;
// among equal ones the first in choice_before's order), sorted by choice_before. Whatever a
// dropped choice becomes with more layers, its dominator becomes something at least as good.
// Sorted so, every choice before c recomputes no more layers; c is dominated when one kept
// before it is as fast and saves as much: `stairs` holds the kept choices' largest saving up
// to each extra time.
std::vector<Choice> pareto(std::vector<Choice> all) {
  std::sort(all.begin(), all.end(), choice_before);
  std::vector<Choice> kept;
  std::map<double, std::int64_t> stairs;  // extra -> saved, both increasing
  for (Choice& c : all) {
    auto up_to = stairs.upper_bound(c.extra);  // the first step beyond c.extra
    if (up_to != stairs.begin() && std::prev(up_to)->second >= c.saved) continue;
    // the steps c covers (as slow or slower, saving no more) go
    auto it = stairs.lower_bound(c.extra);
    while (it != stairs.end() && it->second <= c.saved) it = stairs.erase(it);
    stairs[c.extra] = c.saved;
    kept.push_back(std::move(c));
  }
  return kept;
}

// Layers [i, j) as one stage: sums and the frontier of its recompute choices.
struct Range {
  double fb = 0.0;               // Σ (forward + backward), in layer order
  double forward = 0.0;          // Σ forward
  double backward = 0.0;         // Σ backward
  double weight = 0.0;           // Σ backward_weight
  double update = 0.0;           // Σ update
  double allreduce = 0.0;        // one update's gradient sum over the replicas
  double transfer = 0.0;         // per microbatch
  std::int64_t fixed = 0;        // parameters + gradients + optimizer
  std::int64_t versions = 0;     // Σ version_bytes
  std::int64_t copies = 0;       // Σ weight_copy_bytes
  std::int64_t activations = 0;  // Σ activation_bytes
  std::int64_t max_saved = 0;    // Σ of the positive savings
  std::vector<Choice> choices;   // the Pareto frontier, in choice_before's order
};

// The stage cuts allowed: allowed(stage, layers it holds).
using Allowed = std::function<bool(int, int)>;

// The smallest largest cost(i, j, r) over the partitions of [0, n) into d stages that
// `allowed` admits; nullopt when none (cost nullopt: the stage cannot be).
template <class T, class Cost>
std::optional<T> min_max(int n, int d, const Cost& cost, const Allowed& allowed) {
  std::vector<std::vector<std::optional<T>>> best(static_cast<size_t>(d) + 1,
                                                  std::vector<std::optional<T>>(n + 1));
  best[0][0] = T{};
  for (int s = 1; s <= d; ++s) {
    for (int j = s; j <= n - (d - s); ++j) {
      std::optional<T>& out = best[s][j];
      for (int i = s - 1; i < j; ++i) {
        if (!best[s - 1][i] || !allowed(s - 1, j - i)) continue;
        const std::optional<T> c = cost(i, j, s - 1);
        if (!c) continue;
        const T v = std::max(*best[s - 1][i], *c);
        if (!out || v < *out) out = v;
      }
    }
  }
  return best[d][n];
}

// Layer counts of the partition of [0, n) into d stages with the smallest Σ count(i, j, r)
// (-1: the stage cannot be) that `allowed` admits; among those, the shortest last stage, then
// the shortest stage before it, ... (a walk back from the end). nullopt when none.
template <class Count>
std::optional<std::vector<int>> min_sum(int n, int d, const Count& count, const Allowed& allowed) {
  std::vector<std::vector<int>> total(static_cast<size_t>(d) + 1, std::vector<int>(n + 1, -1));
  total[0][0] = 0;
  for (int s = 1; s <= d; ++s) {
    for (int j = s; j <= n - (d - s); ++j) {
      for (int i = s - 1; i < j; ++i) {
        if (total[s - 1][i] < 0 || !allowed(s - 1, j - i)) continue;
        const int c = count(i, j, s - 1);
        if (c < 0) continue;
        const int v = total[s - 1][i] + c;
        if (total[s][j] < 0 || v < total[s][j]) total[s][j] = v;
      }
    }
  }
  if (total[d][n] < 0) return std::nullopt;
  std::vector<int> counts(d);
  int j = n, want = total[d][n];
  for (int s = d; s >= 1; --s) {
    for (int i = j - 1; i >= s - 1; --i) {
      if (total[s - 1][i] < 0 || !allowed(s - 1, j - i)) continue;
      const int c = count(i, j, s - 1);
      if (c < 0 || total[s - 1][i] + c != want) continue;
      counts[s - 1] = j - i;
      want -= c;
      j = i;
      break;
    }
  }
  return counts;
}

// A solution of the dynamic programs: its place in the plan order (bottleneck, recomputed
// layers, counts) and the choice of every stage.
struct Solution {
  double bottleneck = 0.0;
  int recomputed = 0;
  std::vector<int> counts;
  std::vector<const Choice*> choices;
};

// Plan order 1-3: smaller bottleneck, fewer recomputed, shorter last stages.
bool solution_before(const Solution& a, const Solution& b) {
  if (a.bottleneck != b.bottleneck) return a.bottleneck < b.bottleneck;
  if (a.recomputed != b.recomputed) return a.recomputed < b.recomputed;
  return std::lexicographical_compare(a.counts.rbegin(), a.counts.rend(), b.counts.rbegin(),
                                      b.counts.rend());
}

class Planner {
 public:
  Planner(std::span<const LayerCosts> layers, const PlannerOptions& options,
          std::vector<StageFactors> factors)
      : layers_(layers),
        o_(options),
        factors_(std::move(factors)),
        n_(static_cast<int>(layers.size())),
        d_(options.stages) {
    build_ranges();
    // the fastest fitting choice of every range at every stage
    fastest_.assign(static_cast<size_t>(d_) * (n_ + 1) * (n_ + 1), kInf);
    for (int r = 0; r < d_; ++r) {
      for (int i = 0; i < n_; ++i) {
        for (int j = i + 1; j <= n_; ++j) {
          double& t = fastest_[index(r, i, j)];
          for (const Choice& c : range(i, j).choices) {
            if (fits(i, j, r, c)) t = std::min(t, seconds(i, j, r, c.extra));
          }
        }
      }
    }
  }

  // The first plan in the plan order among the partitions `allowed` admits.
  std::optional<Solution> solve(const Allowed& allowed) const {
    auto fastest = [&](int i, int j, int r) -> std::optional<double> {
      const double t = fastest_[index(r, i, j)];
      if (t == kInf) return std::nullopt;
      return t;
    };
    const std::optional<double> bottleneck = min_max<double>(n_, d_, fastest, allowed);
    if (!bottleneck) return std::nullopt;
    auto count = [&](int i, int j, int r) {
      const Choice* c = pick(i, j, r, *bottleneck);
      return c ? c->count : -1;
    };
    auto counts = min_sum(n_, d_, count, allowed);
    if (!counts) return std::nullopt;
    Solution s{*bottleneck, 0, *counts, {}};
    int i = 0;
    for (int r = 0; r < d_; ++r) {
      const int j = i + s.counts[r];
      s.choices.push_back(pick(i, j, r, *bottleneck));
      s.recomputed += s.choices.back()->count;
      i = j;
    }
    return s;
  }

  // The best plan, or the error naming the best attempt at the memory limit.
  Expected<Solution> best() const {
    if (!o_.layers_per_stage.empty()) {
      const std::vector<int>& counts = o_.layers_per_stage;
      auto s = solve([&](int r, int len) { return len == counts[static_cast<size_t>(r)]; });
      if (s) return *s;
      return fixed_memory_error();
    }
    auto s = solve([](int, int) { return true; });
    if (s) return *s;
    return memory_error();
  }

  // The first plan in the plan order whose counts differ from `best`'s: the best of the plans
  // that agree with it on stages < s and differ at stage s, over every s.
  std::optional<Solution> runner_up(const Solution& best) const {
    std::optional<Solution> out;
    for (int s = 0; s < d_; ++s) {
      auto other = solve([&](int r, int len) {
        return r < s ? len == best.counts[r] : r == s ? len != best.counts[r] : true;
      });
      if (other && (!out || solution_before(*other, *out))) out = std::move(other);
    }
    return out;
  }

  Expected<PartitionPlan> describe(const Solution& s) const {
    PartitionPlan p;
    p.layers_per_stage = s.counts;
    p.bottleneck_seconds = s.bottleneck;
    p.recomputed_layers = s.recomputed;
    CostModel costs;
    int i = 0;
    for (int r = 0; r < d_; ++r) {
      const int j = i + s.counts[r];
      const Range& g = range(i, j);
      const Choice& c = *s.choices[r];
      p.recompute.insert(p.recompute.end(), c.flags.begin(), c.flags.end());
      StagePlan st;
      st.first_layer = i;
      st.layers = j - i;
      st.recomputed = c.count;
      const double k = speed(r);
      st.compute_seconds = k * (g.fb + c.extra);
      st.recompute_seconds = k * c.extra;
      st.transfer_seconds = g.transfer;
      st.update_seconds = k * factors_[r].updates_per_step * g.update;
      st.allreduce_seconds = factors_[r].updates_per_step * g.allreduce;
      st.step_seconds = seconds(i, j, r, c.extra);
      st.bytes = stage_bytes(layers_.subspan(i, j - i), c.flags, factors_[r]);
      p.stages.push_back(st);
      costs.forward.push_back(k * g.forward);
      costs.backward.push_back(k * (g.backward + c.extra));
      costs.backward_weight.push_back(
          r == 0 ? 0.0 : std::min(k * g.weight, costs.backward.back()));  // stage 0: one pass
      costs.optimizer.push_back(k * g.update);
      costs.allreduce.push_back(g.allreduce);
      if (j < n_)
        costs.activation_bytes.push_back(static_cast<double>(layers_[j - 1].output_bytes));
      i = j;
    }
    if (!o_.split_backward) costs.backward_weight.clear();
    costs.latency = o_.latency;
    costs.bandwidth = o_.bandwidth;
    const int steps = is_synchronous(o_.mode) ? 1 : o_.steps;
    auto schedule = planner_schedule(o_.mode, d_, o_.microbatches, steps);
    if (!schedule) return make_error("planner: {}", schedule.error().message);
    auto sim = simulate(*schedule, costs);
    if (!sim) return make_error("planner: simulating the plan: {}", sim.error().message);
    p.predicted_step_seconds = sim->makespan / steps;
    p.predicted_bubble = sim->bubble_fraction;
    return p;
  }

 private:
  size_t index(int r, int i, int j) const {
    return (static_cast<size_t>(r) * (n_ + 1) + i) * (n_ + 1) + j;
  }
  const Range& range(int i, int j) const { return ranges_[static_cast<size_t>(i) * (n_ + 1) + j]; }

  // m · (compute + transfer) + updates per step · update
  double seconds(int i, int j, int r, double extra) const {
    const Range& g = range(i, j);
    return speed(r) * (o_.microbatches * (g.fb + extra) + factors_[r].updates_per_step * g.update) +
           o_.microbatches * g.transfer + factors_[r].updates_per_step * g.allreduce;
  }

  // One update's gradient sum over the replicas for a stage of `bytes` gradient bytes.
  double allreduce_seconds(std::int64_t bytes) const {
    if (o_.replicas <= 1) return 0.0;
    const double w = o_.replicas;
    return o_.allreduce_latency +
           (o_.allreduce_bandwidth > 0
                ? 2.0 * (w - 1.0) / w * static_cast<double>(bytes) / o_.allreduce_bandwidth
                : 0.0);
  }

  // PlannerOptions::stage_speed of stage r
  double speed(int r) const {
    return o_.stage_speed.empty() ? 1.0 : o_.stage_speed[static_cast<size_t>(r)];
  }

  std::int64_t bytes(int i, int j, int r, std::int64_t saved) const {
    const Range& g = range(i, j);
    const StageFactors& f = factors_[r];
    return saturating_add(
        saturating_add(saturating_add(g.fixed, saturating_mul(f.versions_kept - 1, g.versions)),
                       saturating_mul(f.versions_kept, g.copies)),
        saturating_mul(f.peak_stash, g.activations - saved));
  }

  bool fits(int i, int j, int r, const Choice& c) const {
    return o_.memory_limit_bytes == 0 || bytes(i, j, r, c.saved) <= o_.memory_limit_bytes;
  }

  // The first fitting choice (choice_before's order) whose stage time is at most `bottleneck`.
  const Choice* pick(int i, int j, int r, double bottleneck) const {
    for (const Choice& c : range(i, j).choices) {
      if (fits(i, j, r, c) && seconds(i, j, r, c.extra) <= bottleneck) return &c;
    }
    return nullptr;
  }

  void build_ranges() {
    ranges_.resize(static_cast<size_t>(n_) * (n_ + 1) + n_ + 1);
    auto link = [&](int layer) {
      const double bytes = static_cast<double>(layers_[layer].output_bytes);
      return o_.latency + (o_.bandwidth > 0 ? bytes / o_.bandwidth : 0.0);
    };
    for (int i = 0; i < n_; ++i) {
      Range g;
      std::int64_t gradient_bytes = 0;
      g.choices.push_back(Choice{});
      for (int j = i; j < n_; ++j) {
        const LayerCosts& l = layers_[j];
        g.fb += l.forward + l.backward;
        g.forward += l.forward;
        g.backward += l.backward;
        g.weight += l.backward_weight;
        g.update += l.update;
        g.fixed = saturating_add(
            g.fixed,
            saturating_add(saturating_add(l.parameter_bytes, l.gradient_bytes), l.optimizer_bytes));
        g.versions = saturating_add(g.versions, l.version_bytes);
        g.copies = saturating_add(g.copies, l.weight_copy_bytes);
        g.activations = saturating_add(g.activations, l.activation_bytes);
        // without a limit every plan fits and a recompute only costs time
        const std::int64_t save = o_.memory_limit_bytes > 0 ? l.recompute_saving() : 0;
        std::vector<Choice> next;
        for (const Choice& c : g.choices) {
          Choice keep = c;
          keep.flags.push_back(false);
          next.push_back(std::move(keep));
          if (save <= 0) continue;  // recomputing it would only cost time
          Choice more = c;
          more.extra += l.forward;
          more.saved += save;
          ++more.count;
          more.flags.push_back(true);
          next.push_back(std::move(more));
        }
        if (save > 0) g.max_saved += save;
        g.choices = pareto(std::move(next));
        g.transfer = (i > 0 ? link(i - 1) : 0.0) + (j + 1 < n_ ? link(j) : 0.0);
        gradient_bytes = saturating_add(gradient_bytes, l.gradient_bytes);
        g.allreduce = allreduce_seconds(gradient_bytes);
        ranges_[static_cast<size_t>(i) * (n_ + 1) + j + 1] = g;
      }
    }
  }

  // No plan fits: the partition whose largest stage, recomputing every layer that saves
  // memory, holds the fewest bytes (ties: shorter last stages) and its largest stage.
  Error memory_error() const {
    auto least = [&](int i, int j, int r) -> std::optional<std::int64_t> {
      return bytes(i, j, r, range(i, j).max_saved);
    };
    const Allowed any = [](int, int) { return true; };
    const std::int64_t worst = *min_max<std::int64_t>(n_, d_, least, any);
    const std::vector<int> counts = *min_sum(
        n_, d_, [&](int i, int j, int r) { return *least(i, j, r) <= worst ? 0 : -1; }, any);
    int i = 0, stage = 0, first = 0;
    std::int64_t most = -1;
    for (int r = 0; r < d_; ++r) {
      const std::int64_t b = *least(i, i + counts[r], r);
      if (b > most) {
        most = b;
        stage = r;
        first = i;
      }
      i += counts[r];
    }
    const int size = counts[stage];
    std::vector<bool> flags;
    for (int k = first; k < first + size; ++k) flags.push_back(layers_[k].recompute_saving() > 0);
    const StageBytes sb = stage_bytes(layers_.subspan(first, size), flags, factors_[stage]);
    return make_error(
        "planner: no plan of {} layers in {} stages fits the memory limit of {} bytes per stage, "
        "even recomputing every layer that saves memory: the best attempt, layers per stage [{}], "
        "has stage {} (layers {} .. {}) at {} bytes ({}) > {}",
        n_, d_, o_.memory_limit_bytes, fmt::join(counts, ", "), stage, first, first + size - 1,
        sb.total(), sb.to_string(), o_.memory_limit_bytes);
  }

  // The fixed partition does not fit: its stage holding the most bytes when every layer that
  // saves memory is recomputed.
  Error fixed_memory_error() const {
    int i = 0, stage = 0, first = 0;
    std::int64_t most = -1;
    for (int r = 0; r < d_; ++r) {
      const int j = i + o_.layers_per_stage[static_cast<size_t>(r)];
      const std::int64_t b = bytes(i, j, r, range(i, j).max_saved);
      if (b > most) {
        most = b;
        stage = r;
        first = i;
      }
      i = j;
    }
    const int size = o_.layers_per_stage[static_cast<size_t>(stage)];
    std::vector<bool> flags;
    for (int k = first; k < first + size; ++k) flags.push_back(layers_[k].recompute_saving() > 0);
    const StageBytes sb = stage_bytes(layers_.subspan(first, size), flags, factors_[stage]);
    return make_error(
        "planner: the partition [{}] does not fit the memory limit of {} bytes per stage, even "
        "recomputing every layer that saves memory: stage {} (layers {} .. {}) at {} bytes ({}) "
        "> {}",
        fmt::join(o_.layers_per_stage, ", "), o_.memory_limit_bytes, stage, first, first + size - 1,
        sb.total(), sb.to_string(), o_.memory_limit_bytes);
  }

  std::span<const LayerCosts> layers_;
  PlannerOptions o_;
  std::vector<StageFactors> factors_;
  int n_ = 0;
  int d_ = 0;
  std::vector<Range> ranges_;    // [i * (n + 1) + j]: layers [i, j)
  std::vector<double> fastest_;  // [index(r, i, j)]: the fastest fitting stage time, or inf
};

Status check_options(std::span<const LayerCosts> layers, const PlannerOptions& o) {
  const int n = static_cast<int>(layers.size());
  if (n == 0) return make_error("planner: no layers to plan");
  if (o.stages < 1 || o.stages > n) {
    return make_error(
        "planner: stages = {} is not allowed: expected 1 .. {} (every stage holds at least one of "
        "the {} layers)",
        o.stages, n, n);
  }
  if (o.microbatches < 1) {
    return make_error("planner: microbatches = {} is not allowed: it must be >= 1", o.microbatches);
  }
  if (o.steps < 1)
    return make_error("planner: steps = {} is not allowed: it must be >= 1", o.steps);
  if (o.memory_limit_bytes < 0) {
    return make_error(
        "planner: memory_limit_bytes = {} is not allowed: it must be >= 0 (0 = no limit)",
        o.memory_limit_bytes);
  }
  if (!std::isfinite(o.bandwidth) || o.bandwidth < 0) {
    return make_error(
        "planner: bandwidth = {} is not allowed: it must be finite and >= 0 bytes per second (0 = "
        "infinite)",
        o.bandwidth);
  }
  if (o.replicas < 1) {
    return make_error("planner: replicas = {} is not allowed: it must be >= 1", o.replicas);
  }
  if (!std::isfinite(o.allreduce_bandwidth) || o.allreduce_bandwidth < 0 ||
      !std::isfinite(o.allreduce_latency) || o.allreduce_latency < 0) {
    return make_error(
        "planner: all-reduce bandwidth {} and latency {} are not allowed: both must be finite and "
        ">= 0 (bandwidth 0 = infinite)",
        o.allreduce_bandwidth, o.allreduce_latency);
  }
  if (!std::isfinite(o.latency) || o.latency < 0) {
    return make_error("planner: latency = {} is not allowed: it must be finite and >= 0 seconds",
                      o.latency);
  }
  if (!o.stage_speed.empty()) {
    if (static_cast<int>(o.stage_speed.size()) != o.stages) {
      return make_error("planner: {} stage speeds for {} stages", o.stage_speed.size(), o.stages);
    }
    for (size_t r = 0; r < o.stage_speed.size(); ++r) {
      if (!std::isfinite(o.stage_speed[r]) || !(o.stage_speed[r] > 0)) {
        return make_error(
            "planner: stage {}'s speed factor {} is not allowed: it must be finite and > 0", r,
            o.stage_speed[r]);
      }
    }
  }
  if (auto st = check_layer_costs(layers); !st) {
    return make_error("planner: {}", st.error().message);
  }
  if (!o.layers_per_stage.empty()) {
    const std::vector<int>& c = o.layers_per_stage;
    int sum = 0;
    bool positive = true;
    for (int x : c) {
      sum += x;
      positive = positive && x >= 1;
    }
    if (static_cast<int>(c.size()) != o.stages || !positive || sum != n) {
      return make_error(
          "planner: layers_per_stage = [{}] is not allowed: expected {} counts >= 1 summing to "
          "the {} layers",
          fmt::join(c, ", "), o.stages, n);
    }
  }
  return {};
}

}  // namespace

std::string PartitionPlan::to_string() const {
  std::vector<int> recomputed;
  for (size_t k = 0; k < recompute.size(); ++k) {
    if (recompute[k]) recomputed.push_back(static_cast<int>(k));
  }
  return fmt::format(
      "[{}] recompute {{{}}}: bottleneck {:.6g} s, predicted step {:.6g} s, bubble {:.3f}",
      fmt::join(layers_per_stage, ", "), fmt::join(recomputed, ", "), bottleneck_seconds,
      predicted_step_seconds, predicted_bubble);
}

Expected<PlannerResult> plan_partition(std::span<const LayerCosts> layers,
                                       const PlannerOptions& options) {
  if (auto st = check_options(layers, options); !st) return st.error();
  auto factors = stage_factors(options.mode, options.stages, options.microbatches);
  if (!factors) return make_error("planner: {}", factors.error().message);
  const Planner planner(layers, options, std::move(*factors));
  auto best = planner.best();
  if (!best) return best.error();
  PlannerResult out;
  auto plan = planner.describe(*best);
  if (!plan) return plan.error();
  out.plan = std::move(*plan);
  out.ranked.push_back(out.plan);
  if (!options.layers_per_stage.empty()) return out;  // a fixed partition has no runner-up
  if (auto other = planner.runner_up(*best)) {
    auto second = planner.describe(*other);
    if (!second) return second.error();
    out.runner_up = std::move(*second);
    // the simulator's ranking; a tie keeps the planner's order
    if (out.runner_up->predicted_step_seconds < out.plan.predicted_step_seconds) {
      out.ranked.insert(out.ranked.begin(), *out.runner_up);
    } else {
      out.ranked.push_back(*out.runner_up);
    }
  }
  return out;
}

Expected<PartitionPlan> plan_fixed_partition(std::span<const LayerCosts> layers,
                                             const PlannerOptions& options,
                                             std::span<const int> counts) {
  PlannerOptions fixed = options;
  fixed.layers_per_stage.assign(counts.begin(), counts.end());
  auto planned = plan_partition(layers, fixed);
  if (!planned) return planned.error();
  return std::move(planned->plan);
}

}  // namespace actorpipe
