// Simulator: the shared replay with a cost model. Links are FIFO per direction and boundary; the
// memory figures (stash, versions) follow from the action order alone.
#include "engine/schedule/simulator.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <set>

#include "engine/schedule/internal/replay.hpp"
#include "engine/schedule/lowering.hpp"
#include "engine/schedule/validate.hpp"

namespace actorpipe {
namespace {

Status check_costs(const char* name, const std::vector<double>& v, size_t want, bool optional) {
  if (optional && v.empty()) return {};
  if (v.size() != want) {
    return make_error("cost model: {} has {} entries, expected {}{}", name, v.size(), want,
                      optional ? " (or none)" : "");
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (!std::isfinite(v[i]) || v[i] < 0) {
      return make_error("cost model: {}[{}] = {} is not allowed: it must be finite and >= 0", name,
                        i, v[i]);
    }
  }
  return {};
}

}  // namespace

CostModel uniform_costs(int stages, double f, double b) {
  CostModel c;
  c.forward.assign(std::max(stages, 0), f);
  c.backward.assign(std::max(stages, 0), b);
  return c;
}

Expected<std::vector<double>> sum_layers_per_stage(const std::vector<double>& per_layer,
                                                   const std::vector<int>& layers_per_stage) {
  std::vector<double> out;
  size_t next = 0;
  for (size_t r = 0; r < layers_per_stage.size(); ++r) {
    const int n = layers_per_stage[r];
    if (n < 1) {
      return make_error("layers per stage: stage {} has {} layers; every stage needs >= 1", r, n);
    }
    if (next + n > per_layer.size()) break;
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += per_layer[next++];
    out.push_back(sum);
  }
  if (out.size() != layers_per_stage.size() || next != per_layer.size()) {
    size_t total = 0;
    for (int n : layers_per_stage) total += std::max(n, 0);
    return make_error("layers per stage add up to {}, but there are {} layer costs", total,
                      per_layer.size());
  }
  return out;
}

Expected<Simulation> simulate(const Schedule& input, const CostModel& costs) {
  Schedule s = input;
  if (!is_lowered(s)) {
    auto lowered = lower(s);
    if (!lowered) return lowered.error();
    s = std::move(*lowered);
  }
  if (auto st = validate(s); !st) return st.error();
  const size_t d = s.stages;
  if (auto st = check_costs("forward", costs.forward, d, false); !st) return st.error();
  if (auto st = check_costs("backward", costs.backward, d, false); !st) return st.error();
  if (auto st = check_costs("optimizer", costs.optimizer, d, true); !st) return st.error();
  if (auto st = check_costs("allreduce", costs.allreduce, d, true); !st) return st.error();
  if (auto st = check_costs("backward_weight", costs.backward_weight, d, true); !st) {
    return st.error();
  }
  for (size_t r = 0; r < costs.backward_weight.size(); ++r) {
    if (costs.backward_weight[r] > costs.backward[r]) {
      return make_error(
          "cost model: backward_weight[{}] = {} is not allowed: it is part of backward[{}] = {}", r,
          costs.backward_weight[r], r, costs.backward[r]);
    }
  }
  if (auto st = check_costs("activation_bytes", costs.activation_bytes, d - 1, true); !st) {
    return st.error();
  }
  if (auto st = check_costs("latency", {costs.latency}, 1, false); !st) return st.error();
  if (auto st = check_costs("bandwidth", {costs.bandwidth}, 1, false); !st) return st.error();
  for (const auto& [a, b] : costs.paired_updates) {
    if (a < 0 || b < 0 || a >= static_cast<int>(d) || b >= static_cast<int>(d) || a == b) {
      return make_error(
          "cost model: paired_updates ({}, {}) is not allowed: two different stages in [0, {})", a,
          b, d);
    }
  }

  // link_free[r][0]: r -> r+1 (activations), link_free[r][1]: r+1 -> r (gradients).
  std::vector<std::array<double, 2>> link_free(d, {0.0, 0.0});
  // per stage: the last action it ran was the B of this microbatch (-1: another action), whose
  // result was ready at b_ready
  std::vector<int> b_mb(d, -1);
  std::vector<double> b_ready(d, 0.0);
  auto execute = [&](const Action& a, double clock, double dep_ready) -> internal::Timing {
    const size_t r = a.stage;
    const int after_b = b_mb[r];
    b_mb[r] = -1;
    switch (a.kind) {
      case ActionKind::F:
      case ActionKind::B:
      case ActionKind::OPT_STEP: {
        const double cost = a.kind == ActionKind::F ? costs.forward[r]
                            : a.kind == ActionKind::B
                                ? costs.backward[r]
                                : (costs.optimizer.empty() ? 0.0 : costs.optimizer[r]) +
                                      (costs.allreduce.empty() ? 0.0 : costs.allreduce[r]);
        const double start = std::max(clock, dep_ready);
        double ready = start + cost;
        if (a.kind == ActionKind::B) {
          if (!costs.backward_weight.empty()) ready -= costs.backward_weight[r];
          b_mb[r] = a.microbatch;
          b_ready[r] = ready;
        }
        return {start, start + cost, ready};
      }
      case ActionKind::SEND_F:
      case ActionKind::SEND_B: {
        const bool fwd = a.kind == ActionKind::SEND_F;
        const size_t boundary = fwd ? r : r - 1;
        const double bytes =
            costs.activation_bytes.empty() ? 0.0 : costs.activation_bytes[boundary];
        const double wire = costs.bandwidth > 0 ? bytes / costs.bandwidth : 0.0;
        double& free = link_free[boundary][fwd ? 0 : 1];
        // a split B sends its gradient itself, before its weight half
        const double issued = !fwd && after_b == a.microbatch ? b_ready[r] : clock;
        const double tx = std::max(issued, free);
        free = tx + wire;
        return {issued, clock, tx + wire + costs.latency};
      }
      case ActionKind::RECV_F:
      case ActionKind::RECV_B: {
        const double end = std::max(clock, dep_ready);
        return {clock, end, end};
      }
      case ActionKind::FLUSH: {
        const double start = std::max(clock, dep_ready);
        return {start, start, start};
      }
    }
    return {clock, clock, clock};
  };
  internal::Replay rep = internal::replay(s, execute, /*force=*/false, costs.paired_updates);
  if (rep.deadlocked)
    return make_error(
        "simulation deadlocked (the validator should have caught it, or paired_updates cannot "
        "be met)");

  Simulation sim;
  sim.busy.assign(d, 0.0);
  for (size_t r = 0; r < d; ++r) {
    for (size_t i = 0; i < s.per_stage[r].size(); ++i) {
      const Action& a = s.per_stage[r][i];
      const internal::Timing& t = rep.timing[r][i];
      const bool send = a.kind == ActionKind::SEND_F || a.kind == ActionKind::SEND_B;
      sim.timeline.push_back({a, t.start, send ? t.ready : t.end});
      sim.makespan = std::max(sim.makespan, t.end);
      if (is_compute(a.kind) || a.kind == ActionKind::OPT_STEP) sim.busy[r] += t.end - t.start;
    }
  }
  std::stable_sort(sim.timeline.begin(), sim.timeline.end(),
                   [](const TimedAction& x, const TimedAction& y) {
                     if (x.start != y.start) return x.start < y.start;
                     return x.action.stage < y.action.stage;
                   });
  double busy = 0;
  for (double b : sim.busy) busy += b;
  const double area = static_cast<double>(d) * sim.makespan;
  sim.bubble_fraction = area > 0 ? (area - busy) / area : 0.0;
  sim.peak_stash = peak_stash(s);
  sim.versions_kept = versions_kept(s);
  return sim;
}

std::vector<int> peak_stash(const Schedule& schedule) {
  std::vector<int> out;
  for (const auto& list : schedule.per_stage) {
    int live = 0, peak = 0;
    for (const Action& a : list) {
      if (a.kind == ActionKind::F) peak = std::max(peak, ++live);
      if (a.kind == ActionKind::B) --live;
    }
    out.push_back(peak);
  }
  return out;
}

std::vector<int> versions_kept(const Schedule& schedule) {
  std::vector<int> out;
  for (const auto& list : schedule.per_stage) {
    std::map<int, int> backward_version;  // microbatch -> version its B uses
    for (const Action& a : list) {
      if (a.kind == ActionKind::B) backward_version[a.microbatch] = a.version;
    }
    int latest = 0, peak = 1;
    std::map<int, int> in_flight;  // microbatch -> version it pins
    for (const Action& a : list) {
      if (a.kind == ActionKind::OPT_STEP) latest = a.version;
      if (a.kind == ActionKind::F) {
        auto it = backward_version.find(a.microbatch);
        in_flight[a.microbatch] = it == backward_version.end() ? a.version : it->second;
      }
      if (a.kind == ActionKind::B) in_flight.erase(a.microbatch);
      std::set<int> alive{latest};
      for (const auto& [mb, v] : in_flight) {
        if (v <= latest) alive.insert(v);
      }
      peak = std::max(peak, static_cast<int>(alive.size()));
    }
    out.push_back(peak);
  }
  return out;
}

std::string format_timeline(const Simulation& sim) {
  std::string out = fmt::format("{:>12} {:>12} {:>5}  {}\n", "start", "end", "stage", "action");
  for (const TimedAction& t : sim.timeline) {
    out += fmt::format("{:>12.6f} {:>12.6f} {:>5}  {}\n", t.start, t.end, t.action.stage,
                       to_string(t.action));
  }
  return out;
}

}  // namespace actorpipe
