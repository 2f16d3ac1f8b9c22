// Schedule validator: structural checks per action and per stage, send/receive matching, and a
// deterministic replay that finds deadlocks; failures show the grid with the failing step marked.
#include "engine/schedule/validate.hpp"

#include <algorithm>
#include <optional>

#include "engine/schedule/internal/replay.hpp"

namespace actorpipe {
namespace {

struct Failure {
  int stage = -1;  // row to mark, -1: none
  int index = -1;  // action to mark, -1: only the row
  std::string what;
};

Error report(const Schedule& s, const Failure& f) {
  std::string where;
  if (f.stage >= 0 && f.stage < static_cast<int>(s.per_stage.size()) && f.index >= 0 &&
      f.index < static_cast<int>(s.per_stage[f.stage].size())) {
    where = fmt::format("stage {}, action {} ({}): ", f.stage, f.index,
                        to_string(s.per_stage[f.stage][f.index]));
  } else if (f.stage >= 0) {
    where = fmt::format("stage {}: ", f.stage);
  }
  GridOptions grid;
  grid.mark_stage = f.stage;
  grid.mark_index = f.index;
  return make_error("invalid {} schedule (d={}, m={}, steps={}): {}{}\n{}", to_string(s.mode),
                    s.stages, s.microbatches, s.steps, where, f.what, format_grid(s, grid));
}

std::optional<Failure> check_shape(const Schedule& s) {
  if (s.stages < 1) return Failure{-1, -1, fmt::format("stages = {}, must be >= 1", s.stages)};
  if (static_cast<int>(s.per_stage.size()) != s.stages) {
    return Failure{-1, -1,
                   fmt::format("{} action lists for {} stages: need exactly one per stage",
                               s.per_stage.size(), s.stages)};
  }
  if (s.microbatches < 1) {
    return Failure{-1, -1, fmt::format("microbatches = {}, must be >= 1", s.microbatches)};
  }
  if (s.steps < 1) return Failure{-1, -1, fmt::format("steps = {}, must be >= 1", s.steps)};
  return std::nullopt;
}

std::optional<Failure> check_actions(const Schedule& s) {
  const int d = s.stages, n = s.total_microbatches();
  for (int r = 0; r < d; ++r) {
    const auto& list = s.per_stage[r];
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[i];
      auto fail = [&](std::string what) { return Failure{r, i, std::move(what)}; };
      if (a.stage != r) {
        return fail(fmt::format("the action names stage {} but is in stage {}'s list", a.stage, r));
      }
      const bool per_mb = is_compute(a.kind) || is_comm(a.kind);
      if (per_mb && (a.microbatch < 0 || a.microbatch >= n)) {
        return fail(fmt::format("microbatch {} is out of range: allowed 0..{} ({} x {} steps)",
                                a.microbatch, n - 1, s.microbatches, s.steps));
      }
      if (!per_mb && a.microbatch != -1) {
        return fail(fmt::format("{} carries microbatch {}; it must be -1", to_string(a.kind),
                                a.microbatch));
      }
      if ((a.kind == ActionKind::SEND_F || a.kind == ActionKind::RECV_B) && r == d - 1) {
        return fail(fmt::format("{} at the last stage: there is no next stage", to_string(a.kind)));
      }
      if ((a.kind == ActionKind::RECV_F || a.kind == ActionKind::SEND_B) && r == 0) {
        return fail(
            fmt::format("{} at the first stage: there is no previous stage", to_string(a.kind)));
      }
    }
  }
  return std::nullopt;
}

// Every SEND has its RECV on the neighbour stage and every RECV its SEND.
std::optional<Failure> check_matching(const Schedule& s, const internal::ActionIndex& index) {
  for (int r = 0; r < s.stages; ++r) {
    const auto& list = s.per_stage[r];
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[i];
      int peer = 0;
      ActionKind other{};
      switch (a.kind) {
        case ActionKind::SEND_F:
          peer = r + 1, other = ActionKind::RECV_F;
          break;
        case ActionKind::RECV_F:
          peer = r - 1, other = ActionKind::SEND_F;
          break;
        case ActionKind::SEND_B:
          peer = r - 1, other = ActionKind::RECV_B;
          break;
        case ActionKind::RECV_B:
          peer = r + 1, other = ActionKind::SEND_B;
          break;
        default:
          continue;
      }
      if (index.find(peer, other, a.microbatch) < 0) {
        const bool send = a.kind == ActionKind::SEND_F || a.kind == ActionKind::SEND_B;
        return Failure{
            r, i,
            fmt::format("{} of microbatch {} has no matching {} at stage {} ({})",
                        to_string(a.kind), a.microbatch, to_string(other), peer,
                        send ? "a send without its receive" : "a receive without its send")};
      }
    }
  }
  return std::nullopt;
}

enum Seen : unsigned { kF = 1, kB = 2, kSendF = 4, kRecvF = 8, kSendB = 16, kRecvB = 32 };

unsigned bit_of(ActionKind kind) {
  switch (kind) {
    case ActionKind::F:
      return kF;
    case ActionKind::B:
      return kB;
    case ActionKind::SEND_F:
      return kSendF;
    case ActionKind::RECV_F:
      return kRecvF;
    case ActionKind::SEND_B:
      return kSendB;
    case ActionKind::RECV_B:
      return kRecvB;
    default:
      return 0;
  }
}

std::optional<Failure> check_stage(const Schedule& s, int r, bool lowered) {
  const int d = s.stages, n = s.total_microbatches();
  const auto& list = s.per_stage[r];
  std::vector<unsigned> seen(n, 0);
  std::vector<int> first(n * 8, -1);  // index of the first (microbatch, kind)
  std::vector<bool> has_b(n, false);  // a missing B is reported as such, not at a FLUSH
  for (const Action& a : list) {
    if (a.kind == ActionKind::B) has_b[a.microbatch] = true;
  }
  int opt_version = 0;
  for (int i = 0; i < static_cast<int>(list.size()); ++i) {
    const Action& a = list[i];
    auto fail = [&](std::string what) { return Failure{r, i, std::move(what)}; };
    const std::string kind(to_string(a.kind));
    if (a.kind == ActionKind::OPT_STEP) {
      if (a.version != opt_version + 1) {
        return fail(fmt::format(
            "OPT_STEP produces version {}, expected {} (the OPT_STEPs of a stage produce "
            "versions 1, 2, 3, ...)",
            a.version, opt_version + 1));
      }
      opt_version = a.version;
      continue;
    }
    if (a.kind == ActionKind::FLUSH) {
      for (int j = 0; j < n; ++j) {
        if ((seen[j] & kF) && !(seen[j] & kB) && has_b[j]) {
          return fail(
              fmt::format("FLUSH with microbatch {} in flight (its F ran, its B did not)", j));
        }
      }
      continue;
    }
    const int mb = a.microbatch;
    const unsigned bit = bit_of(a.kind);
    int& first_at = first[mb * 8 + static_cast<int>(a.kind)];
    if (seen[mb] & bit) {
      return fail(
          fmt::format("duplicate {} of microbatch {} (first at action {})", kind, mb, first_at));
    }
    seen[mb] |= bit;
    first_at = i;
    switch (a.kind) {
      case ActionKind::F:
        if (lowered && r > 0 && !(seen[mb] & kRecvF)) {
          return fail(fmt::format("F of microbatch {} has no RECV_F before it", mb));
        }
        break;
      case ActionKind::B:
        if (!(seen[mb] & kF)) {
          for (int j = i + 1; j < static_cast<int>(list.size()); ++j) {
            if (list[j].kind == ActionKind::F && list[j].microbatch == mb) {
              return fail(fmt::format("B of microbatch {} runs before its F (action {})", mb, j));
            }
          }
          return fail(fmt::format("F of microbatch {} is missing (its B is here)", mb));
        }
        if (lowered && r < d - 1 && !(seen[mb] & kRecvB)) {
          return fail(fmt::format("B of microbatch {} has no RECV_B before it", mb));
        }
        break;
      case ActionKind::SEND_F:
        if (!(seen[mb] & kF)) return fail(fmt::format("SEND_F of microbatch {} before its F", mb));
        break;
      case ActionKind::SEND_B:
        if (!(seen[mb] & kB)) return fail(fmt::format("SEND_B of microbatch {} before its B", mb));
        break;
      default:
        break;
    }
  }
  for (int mb = 0; mb < n; ++mb) {
    auto at = [&](ActionKind k) { return first[mb * 8 + static_cast<int>(k)]; };
    if (!(seen[mb] & kF)) {
      return Failure{r, -1, fmt::format("F of microbatch {} is missing", mb)};
    }
    if (!(seen[mb] & kB)) {
      return Failure{r, at(ActionKind::F),
                     fmt::format("B of microbatch {} is missing (its F is here)", mb)};
    }
    if (lowered && r < d - 1 && !(seen[mb] & kSendF)) {
      return Failure{r, at(ActionKind::F),
                     fmt::format("F of microbatch {} is never sent on: no SEND_F", mb)};
    }
    if (lowered && r > 0 && !(seen[mb] & kSendB)) {
      return Failure{r, at(ActionKind::B),
                     fmt::format("B of microbatch {} is never sent back: no SEND_B", mb)};
    }
  }
  return std::nullopt;
}

std::optional<Failure> check_deadlock(const Schedule& s, const internal::ActionIndex& index,
                                      bool lowered) {
  internal::Replay rep = internal::replay(s, internal::unit_execute, /*force=*/false);
  if (!rep.deadlocked) return std::nullopt;
  std::string why;
  int mark = -1;
  for (int r = 0; r < s.stages; ++r) {
    const auto& list = s.per_stage[r];
    const int at = rep.stuck_at[r];
    if (at >= static_cast<int>(list.size())) continue;
    if (mark < 0) mark = r;
    const Action& a = list[at];
    if (!why.empty()) why += "; ";
    if (a.kind == ActionKind::FLUSH) {
      const auto k = std::count_if(list.begin(), list.begin() + at,
                                   [](const Action& x) { return x.kind == ActionKind::FLUSH; });
      why += fmt::format("stage {} waits at {} for every stage to reach its FLUSH #{}", r,
                         to_string(a), k + 1);
      continue;
    }
    internal::Dependency dep = internal::dependency_of(a, r, s.stages, lowered, index);
    const int peer = dep.wanted.stage;
    const auto& peer_list = s.per_stage[peer];
    const int peer_at = rep.stuck_at[peer];
    why += fmt::format("stage {} waits at {} for {}, but stage {} is blocked earlier at {}", r,
                       to_string(a), to_string(dep.wanted), peer,
                       peer_at < static_cast<int>(peer_list.size()) ? to_string(peer_list[peer_at])
                                                                    : std::string("its end"));
  }
  return Failure{mark, rep.stuck_at[mark], "deadlock: no stage can proceed: " + why};
}

}  // namespace

Status validate(const Schedule& s) {
  if (auto f = check_shape(s)) return report(s, *f);
  if (auto f = check_actions(s)) return report(s, *f);
  const bool lowered = is_lowered(s);
  const internal::ActionIndex index(s);
  if (lowered) {
    if (auto f = check_matching(s, index)) return report(s, *f);
  }
  for (int r = 0; r < s.stages; ++r) {
    if (auto f = check_stage(s, r, lowered)) return report(s, *f);
  }
  if (auto f = check_deadlock(s, index, lowered)) return report(s, *f);
  return {};
}

}  // namespace actorpipe
