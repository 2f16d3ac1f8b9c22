// Deterministic replay of a schedule: every stage runs its actions in order, an action starts when
// its cross-stage dependency has executed. FLUSH is a barrier over all stages.
#include "engine/schedule/internal/replay.hpp"

#include <algorithm>

namespace actorpipe::internal {
namespace {

uint64_t key(int stage, ActionKind kind, int microbatch) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(stage)) << 40) ^
         (static_cast<uint64_t>(kind) << 32) ^ static_cast<uint32_t>(microbatch);
}

}  // namespace

ActionIndex::ActionIndex(const Schedule& schedule) {
  for (size_t r = 0; r < schedule.per_stage.size(); ++r) {
    const auto& list = schedule.per_stage[r];
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      map_.emplace(key(static_cast<int>(r), a.kind, a.microbatch), static_cast<int>(i));
    }
  }
}

int ActionIndex::find(int stage, ActionKind kind, int microbatch) const {
  auto it = map_.find(key(stage, kind, microbatch));
  return it == map_.end() ? -1 : it->second;
}

Dependency dependency_of(const Action& a, int row, int stages, bool lowered,
                         const ActionIndex& index) {
  Dependency dep;
  auto want = [&](int stage, ActionKind kind) {
    dep.exists = true;
    dep.wanted = Action{stage, kind, a.microbatch, 0, 0};
    dep.index = index.find(stage, kind, a.microbatch);
  };
  if (lowered) {
    if (a.kind == ActionKind::RECV_F && row > 0) want(row - 1, ActionKind::SEND_F);
    if (a.kind == ActionKind::RECV_B && row < stages - 1) want(row + 1, ActionKind::SEND_B);
  } else {
    if (a.kind == ActionKind::F && row > 0) want(row - 1, ActionKind::F);
    if (a.kind == ActionKind::B && row < stages - 1) want(row + 1, ActionKind::B);
  }
  return dep;
}

Timing unit_execute(const Action&, double clock, double dep_ready) {
  double start = std::max(clock, dep_ready);
  return {start, start + 1, start + 1};
}

Replay replay(const Schedule& schedule, const ExecuteFn& execute, bool force,
              std::span<const std::pair<int, int>> paired_updates) {
  const auto& ps = schedule.per_stage;
  const int d = static_cast<int>(ps.size());
  const bool lowered = is_lowered(schedule);
  const ActionIndex index(schedule);

  Replay out;
  out.timing.resize(d);
  for (int r = 0; r < d; ++r) out.timing[r].resize(ps[r].size());
  std::vector<int> pc(d, 0);
  std::vector<double> clock(d, 0.0);
  std::vector<std::vector<double>> flush_arrival(d);   // time stage r reached its k-th FLUSH
  std::vector<std::vector<double>> update_arrival(d);  // ... its k-th OPT_STEP
  std::vector<std::vector<int>> partners(d);           // paired_updates, per stage
  for (const auto& [a, b] : paired_updates) {
    if (a < 0 || b < 0 || a >= d || b >= d || a == b) continue;  // the caller validates
    partners[a].push_back(b);
    partners[b].push_back(a);
  }

  auto done = [&](int r) { return pc[r] >= static_cast<int>(ps[r].size()); };
  // When stage s reached its k-th action of `kind` (a FLUSH or an OPT_STEP, whose arrivals are
  // `arrival`); false when it has not (yet).
  auto reached = [&](const std::vector<std::vector<double>>& arrival, ActionKind kind, int s,
                     size_t k, double& when) {
    if (arrival[s].size() > k) {
      when = arrival[s][k];
      return true;
    }
    if (arrival[s].size() == k && !done(s) && ps[s][pc[s]].kind == kind) {
      when = clock[s];
      return true;
    }
    return false;
  };
  // The time the next action of stage r may start, or false when it must wait.
  auto ready_time = [&](int r, double& when) {
    const Action& a = ps[r][pc[r]];
    when = clock[r];
    if (a.kind == ActionKind::OPT_STEP) {
      const size_t k = update_arrival[r].size();
      for (int s : partners[r]) {
        double t = 0;
        if (!reached(update_arrival, ActionKind::OPT_STEP, s, k, t)) return false;
        when = std::max(when, t);
      }
    }
    if (a.kind == ActionKind::FLUSH) {
      const size_t k = flush_arrival[r].size();
      for (int s = 0; s < d; ++s) {
        double t = 0;
        if (!reached(flush_arrival, ActionKind::FLUSH, s, k, t)) return false;
        when = std::max(when, t);
      }
      return true;
    }
    Dependency dep = dependency_of(a, r, d, lowered, index);
    if (!dep.exists) return true;
    if (dep.index < 0 || pc[dep.wanted.stage] <= dep.index) return false;
    when = out.timing[dep.wanted.stage][dep.index].ready;
    return true;
  };
  auto run = [&](int r, double dep_ready) {
    const Action& a = ps[r][pc[r]];
    if (a.kind == ActionKind::FLUSH) flush_arrival[r].push_back(clock[r]);
    if (a.kind == ActionKind::OPT_STEP) update_arrival[r].push_back(clock[r]);
    Timing t = execute(a, clock[r], dep_ready);
    out.timing[r][pc[r]] = t;
    clock[r] = t.end;
    ++pc[r];
  };

  for (;;) {
    bool progress = false;
    for (int r = 0; r < d; ++r) {
      double when = 0;
      while (!done(r) && ready_time(r, when)) {
        run(r, when);
        progress = true;
      }
    }
    bool all_done = true;
    for (int r = 0; r < d; ++r) all_done = all_done && done(r);
    if (all_done) break;
    if (!progress) {
      if (!out.deadlocked) {
        out.deadlocked = true;
        out.stuck_at.assign(pc.begin(), pc.end());
      }
      if (!force) break;
      for (int r = 0; r < d; ++r) {
        if (!done(r)) {
          run(r, clock[r]);
          break;
        }
      }
    }
  }
  return out;
}

}  // namespace actorpipe::internal
