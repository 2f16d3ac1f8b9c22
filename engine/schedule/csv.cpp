// CSV import/export in torch.distributed.pipelining's compute-only form: row = rank, cell = action
// text at its time step, empty = idle. Imports are validated before they are returned.
#include "engine/schedule/csv.hpp"

#include <algorithm>

#include "engine/schedule/validate.hpp"

namespace actorpipe {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

}  // namespace

Expected<std::string> export_csv(const Schedule& schedule) {
  Schedule compute = compute_only(schedule);
  for (auto& list : compute.per_stage) {
    std::erase_if(list, [](const Action& a) { return !is_compute(a.kind); });
  }
  auto slots = unit_slots(compute);
  if (!slots) return slots.error();
  int width = 0;
  for (const auto& row : *slots) {
    for (int t : row) width = std::max(width, t + 1);
  }
  std::string out;
  for (size_t r = 0; r < compute.per_stage.size(); ++r) {
    std::vector<std::string> cells(width);
    for (size_t i = 0; i < compute.per_stage[r].size(); ++i) {
      Action a = compute.per_stage[r][i];
      a.version = a.lookahead = 0;
      cells[(*slots)[r][i]] = to_string(a);
    }
    for (int c = 0; c < width; ++c) out += (c ? "," : "") + cells[c];
    out += "\r\n";
  }
  return out;
}

Expected<Schedule> import_csv(std::string_view text, const CsvImport& options) {
  Schedule s;
  s.mode = options.mode;
  s.steps = 1;
  int max_mb = -1;
  int row = 0;
  while (!text.empty()) {
    size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view{} : text.substr(eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::vector<Action> actions;
    int col = 0;
    int row_max_mb = -1, row_max_col = 0;  // the row's largest microbatch and its column
    std::string_view row_max_cell;
    for (;;) {
      size_t comma = line.find(',');
      std::string_view cell = trim(line.substr(0, comma));
      if (!cell.empty()) {
        auto a = parse_action(cell);
        if (!a) {
          return make_error("CSV row {} column {}: cell '{}' is not an action ({})", row, col, cell,
                            a.error().message);
        }
        if (!is_compute(a->kind) || a->version != 0 || a->lookahead != 0) {
          return make_error(
              "CSV row {} column {}: cell '{}' is not allowed: the compute-only format holds "
              "F and B cells like 0F3 or 0B3",
              row, col, cell);
        }
        if (a->stage != row) {
          return make_error(
              "CSV row {} column {}: cell '{}' names stage {}; one stage per rank is supported, "
              "so row {} may only hold stage {}",
              row, col, cell, a->stage, row, row);
        }
        if (a->microbatch > row_max_mb) {
          row_max_mb = a->microbatch;
          row_max_col = col;
          row_max_cell = cell;
        }
        actions.push_back(*a);
      }
      if (comma == std::string_view::npos) break;
      line.remove_prefix(comma + 1);
      ++col;
    }
    // Every row holds an F and a B of each microbatch 0..m-1: a microbatch no smaller than the
    // row's number of actions cannot be complete, and the validator would size its tables by it.
    if (row_max_mb >= static_cast<int>(actions.size())) {
      return make_error(
          "CSV row {} column {}: cell '{}' names microbatch {}, but row {} holds only {} "
          "actions: every row needs the F and the B of each microbatch 0..{}",
          row, row_max_col, row_max_cell, row_max_mb, row, actions.size(), row_max_mb);
    }
    max_mb = std::max(max_mb, row_max_mb);
    s.per_stage.push_back(std::move(actions));
    ++row;
  }
  // Trailing empty lines are not ranks.
  while (!s.per_stage.empty() && s.per_stage.back().empty()) s.per_stage.pop_back();
  if (s.per_stage.empty() || max_mb < 0) {
    return make_error("CSV has no actions: expected one row per rank with cells like 0F0, 0B0");
  }
  s.stages = static_cast<int>(s.per_stage.size());
  s.microbatches = max_mb + 1;
  if (options.add_step_end) {
    for (int r = 0; r < s.stages; ++r) {
      s.per_stage[r].push_back({r, ActionKind::OPT_STEP, -1, 1, 0});
      s.per_stage[r].push_back({r, ActionKind::FLUSH, -1, 0, 0});
    }
  }
  if (auto st = validate(s); !st) return make_error("imported CSV: {}", st.error().message);
  return s;
}

}  // namespace actorpipe
