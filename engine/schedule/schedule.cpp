// Schedule as data: action text form, parsing, compute-only view and the stage x time grid of a
// unit-cost replay (rows = stages, columns = time slots, blanks = idle).
#include "engine/schedule/schedule.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "engine/schedule/internal/replay.hpp"

namespace actorpipe {
namespace {

constexpr std::string_view kind_names[] = {"F",      "B",      "SEND_F",   "RECV_F",
                                           "SEND_B", "RECV_B", "OPT_STEP", "FLUSH"};
constexpr ActionKind all_kinds[] = {ActionKind::F,        ActionKind::B,      ActionKind::SEND_F,
                                    ActionKind::RECV_F,   ActionKind::SEND_B, ActionKind::RECV_B,
                                    ActionKind::OPT_STEP, ActionKind::FLUSH};

// Reads up to 9 decimal digits at the front of `s`; false when there is none.
bool take_number(std::string_view& s, int& out) {
  size_t n = 0;
  while (n < s.size() && n < 10 && s[n] >= '0' && s[n] <= '9') ++n;
  if (n == 0 || n > 9) return false;
  std::from_chars(s.data(), s.data() + n, out);
  s.remove_prefix(n);
  return true;
}

}  // namespace

std::string_view to_string(ActionKind kind) {
  const auto i = static_cast<size_t>(kind);
  return i < std::size(kind_names) ? kind_names[i] : "UNKNOWN";
}

bool from_string(std::string_view name, ActionKind& out) {
  for (ActionKind k : all_kinds) {
    if (to_string(k) == name) {
      out = k;
      return true;
    }
  }
  return false;
}

bool is_compute(ActionKind kind) {
  return kind == ActionKind::F || kind == ActionKind::B;
}

bool is_comm(ActionKind kind) {
  return kind == ActionKind::SEND_F || kind == ActionKind::RECV_F || kind == ActionKind::SEND_B ||
         kind == ActionKind::RECV_B;
}

std::string to_string(const Action& a) {
  std::string out = fmt::format("{}{}", a.stage, to_string(a.kind));
  if (a.kind == ActionKind::OPT_STEP) return out + fmt::format("@{}", a.version);
  if (a.kind == ActionKind::FLUSH) return out;
  out += fmt::format("{}", a.microbatch);
  if (a.version != 0) out += fmt::format("@{}", a.version);
  if (a.lookahead != 0) out += fmt::format("+{}", a.lookahead);
  return out;
}

Expected<Action> parse_action(std::string_view text) {
  auto bad = [&] {
    return make_error(
        "action text '{}' is malformed: expected <stage><KIND><microbatch>[@<version>]"
        "[+<lookahead>] with KIND one of F, B, SEND_F, RECV_F, SEND_B, RECV_B "
        "(e.g. 2F0, 1SEND_B3, 3B17@2), or <stage>OPT_STEP@<version>, or <stage>FLUSH",
        text);
  };
  std::string_view s = text;
  Action a;
  if (!take_number(s, a.stage)) return bad();
  // Longest kind name first: "FLUSH" before "F".
  size_t best = 0;
  for (ActionKind k : all_kinds) {
    std::string_view name = to_string(k);
    if (name.size() > best && s.substr(0, name.size()) == name) {
      best = name.size();
      a.kind = k;
    }
  }
  if (best == 0) return bad();
  s.remove_prefix(best);
  if (a.kind == ActionKind::FLUSH) return s.empty() ? Expected<Action>(a) : Expected<Action>(bad());
  if (a.kind == ActionKind::OPT_STEP) {
    if (s.empty() || s.front() != '@') return bad();
    s.remove_prefix(1);
    if (!take_number(s, a.version) || !s.empty()) return bad();
    return a;
  }
  if (!take_number(s, a.microbatch)) return bad();
  if (!s.empty() && s.front() == '@') {
    s.remove_prefix(1);
    // a continued 2bw run's step 0 computes with version -1
    const bool negative = s.starts_with("-1") && (s.size() == 2 || s[2] == '+');
    if (negative) {
      s.remove_prefix(2);
      a.version = -1;
    } else if (!take_number(s, a.version)) {
      return bad();
    }
  }
  if (!s.empty() && s.front() == '+') {
    s.remove_prefix(1);
    if (!take_number(s, a.lookahead)) return bad();
  }
  if (!s.empty()) return bad();
  return a;
}

bool is_lowered(const Schedule& schedule) {
  for (const auto& list : schedule.per_stage) {
    for (const Action& a : list) {
      if (is_comm(a.kind)) return true;
    }
  }
  return false;
}

Schedule compute_only(const Schedule& schedule) {
  Schedule out = schedule;
  for (auto& list : out.per_stage) {
    std::erase_if(list, [](const Action& a) { return is_comm(a.kind); });
  }
  return out;
}

Expected<Schedule> first_steps(const Schedule& schedule, int steps) {
  if (steps < 1 || steps > schedule.steps) {
    return make_error("the first {} steps of a schedule of {} steps: expected 1 to {}", steps,
                      schedule.steps, schedule.steps);
  }
  const int64_t end = static_cast<int64_t>(steps) * schedule.microbatches;
  Schedule out = schedule;
  out.steps = steps;
  for (auto& list : out.per_stage) {
    std::erase_if(list, [&](const Action& a) {
      if (a.kind == ActionKind::OPT_STEP) return a.version > steps;
      if (a.kind == ActionKind::FLUSH) return false;
      return a.microbatch >= end;
    });
  }
  return out;
}

Expected<std::vector<std::vector<int>>> unit_slots(const Schedule& schedule) {
  internal::Replay rep = internal::replay(schedule, internal::unit_execute, /*force=*/false);
  if (rep.deadlocked) {
    std::string where;
    for (size_t r = 0; r < rep.stuck_at.size(); ++r) {
      const auto& list = schedule.per_stage[r];
      if (rep.stuck_at[r] < static_cast<int>(list.size())) {
        where += fmt::format("{}{}", where.empty() ? "" : ", ", to_string(list[rep.stuck_at[r]]));
      }
    }
    return make_error("schedule deadlocks: no stage can proceed (blocked at {})", where);
  }
  std::vector<std::vector<int>> slots(rep.timing.size());
  for (size_t r = 0; r < rep.timing.size(); ++r) {
    for (const auto& t : rep.timing[r]) slots[r].push_back(static_cast<int>(std::lround(t.start)));
  }
  return slots;
}

std::string format_grid(const Schedule& schedule, const GridOptions& options) {
  internal::Replay rep = internal::replay(schedule, internal::unit_execute, /*force=*/true);
  const int d = static_cast<int>(schedule.per_stage.size());
  int slots = 0;
  for (const auto& row : rep.timing) {
    for (const auto& t : row) slots = std::max(slots, static_cast<int>(std::lround(t.end)));
  }
  std::vector<std::vector<std::string>> cells(d, std::vector<std::string>(slots));
  for (int r = 0; r < d; ++r) {
    const auto& list = schedule.per_stage[r];
    for (size_t i = 0; i < list.size(); ++i) {
      Action a = list[i];
      if (!options.versions && a.kind != ActionKind::OPT_STEP) a.version = a.lookahead = 0;
      std::string text = to_string(a);
      if (r == options.mark_stage && static_cast<int>(i) == options.mark_index) {
        text = "[" + text + "]";
      }
      cells[r][std::lround(rep.timing[r][i].start)] = std::move(text);
    }
  }
  const std::string label = "stage";
  std::vector<size_t> width(slots);
  for (int c = 0; c < slots; ++c) {
    width[c] = fmt::formatted_size("{}", c);
    for (int r = 0; r < d; ++r) width[c] = std::max(width[c], cells[r][c].size());
  }
  auto line = [&](const std::string& head, auto cell) {
    std::string out = fmt::format("{:>{}} |", head, label.size());
    for (int c = 0; c < slots; ++c) out += fmt::format(" {:<{}}", cell(c), width[c]);
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out;
  };
  std::string out = line(label, [](int c) { return fmt::format("{}", c); }) + "\n";
  for (int r = 0; r < d; ++r) {
    out += line(fmt::format("{}", r), [&](int c) { return cells[r][c]; });
    if (r == options.mark_stage) out += "  <-- ERROR HERE";
    out += "\n";
  }
  return out;
}

}  // namespace actorpipe
