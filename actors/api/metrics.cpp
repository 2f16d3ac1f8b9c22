// Metrics: derived rates of a step and its one-line JSON form (the loss as the shortest text that
// reads back to the same double, so the file loses no precision; times to the microsecond).
#include "actors/api/actorpipe/metrics.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string_view>
#include <type_traits>

#include "engine/internal/file_io.hpp"

namespace actorpipe {
namespace {

// A JSON number, or null for NaN and infinities (JSON has no literal for them).
void append_number(std::string& out, double x) {
  if (std::isfinite(x)) {
    fmt::format_to(std::back_inserter(out), "{}", x);
  } else {
    out += "null";
  }
}

// Seconds with microsecond resolution (the clocks behind them are not finer than that).
void append_seconds(std::string& out, double x) {
  if (std::isfinite(x)) {
    fmt::format_to(std::back_inserter(out), "{:.6f}", x);
  } else {
    out += "null";
  }
}

void append_text(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  out += '"';
}

template <class T>
void append_list(std::string& out, const std::vector<T>& xs) {
  out += '[';
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i > 0) out += ',';
    if constexpr (std::is_floating_point_v<T>) {
      append_number(out, xs[i]);
    } else {
      fmt::format_to(std::back_inserter(out), "{}", xs[i]);
    }
  }
  out += ']';
}

// The step a line of train.metrics is about, or nothing for a line this code did not write whole.
std::optional<int64_t> step_of_line(std::string_view line) {
  if (line.empty() || line.back() != '}') return std::nullopt;
  for (std::string_view prefix :
       {std::string_view(R"({"step":)"), std::string_view(R"({"migration":{"step":)"),
        std::string_view(R"({"resumed":{"step":)"), std::string_view(R"({"stopped":{"step":)"),
        std::string_view(R"({"restart":{"step":)"), std::string_view(R"({"eval":{"step":)")}) {
    if (line.substr(0, prefix.size()) != prefix) continue;
    int64_t step = 0;
    const char* first = line.data() + prefix.size();
    const auto [end, ec] = std::from_chars(first, line.data() + line.size(), step);
    if (ec != std::errc() || end == first || (*end != ',' && *end != '}')) return std::nullopt;
    return step;
  }
  return std::nullopt;
}

}  // namespace

std::string eval_json(const EvalMetrics& m) {
  std::string out;
  fmt::format_to(std::back_inserter(out), "{{\"eval\":{{\"step\":{},\"loss\":", m.step);
  append_number(out, m.loss);
  fmt::format_to(std::back_inserter(out),
                 ",\"microbatches\":{},\"tokens\":{},\"time\":", m.microbatches, m.tokens);
  append_seconds(out, m.seconds);
  out += "}}";
  return out;
}

std::string resumed_json(int64_t step, const std::string& checkpoint, int64_t dropped) {
  std::string out;
  fmt::format_to(std::back_inserter(out), "{{\"resumed\":{{\"step\":{},\"checkpoint\":", step);
  append_text(out, checkpoint);
  fmt::format_to(std::back_inserter(out), ",\"dropped\":{}}}}}", dropped);
  return out;
}

std::string stopped_json(int64_t step, const std::string& signal, const std::string& checkpoint) {
  std::string out;
  fmt::format_to(std::back_inserter(out), "{{\"stopped\":{{\"step\":{},\"signal\":", step);
  append_text(out, signal);
  out += ",\"checkpoint\":";
  append_text(out, checkpoint);
  out += "}}";
  return out;
}

std::string restart_json(int64_t step, int restart, int max_restarts, const std::string& checkpoint,
                         const std::string& error) {
  std::string out;
  fmt::format_to(std::back_inserter(out),
                 "{{\"restart\":{{\"step\":{},\"restart\":{},\"max_restarts\":{},\"checkpoint\":",
                 step, restart, max_restarts);
  append_text(out, checkpoint);
  out += ",\"error\":";
  append_text(out, error);
  out += "}}";
  return out;
}

namespace {

// Keeps the lines of `path` about a step at or before `step`, then `last` (if not empty).
Expected<int64_t> keep_metrics_until(const std::string& path, int64_t step,
                                     const std::function<std::string(int64_t)>& last) {
  std::string kept;
  int64_t dropped = 0;
  if (std::ifstream in{path, std::ios::binary}) {
    std::string line;
    while (std::getline(in, line)) {
      const auto s = step_of_line(line);
      if (s && *s <= step) {
        kept += line;
        kept += '\n';
      } else {
        ++dropped;
      }
    }
    if (in.bad()) return make_error("train.metrics = \"{}\": read failed", path);
  } else if (std::filesystem::exists(path)) {
    return make_error("train.metrics = \"{}\": cannot open for reading: {}", path,
                      std::strerror(errno));
  }
  if (last) {
    kept += last(dropped);
    kept += '\n';
  }
  // through a temporary file renamed over it: a failure leaves the file as it was
  if (Status ok = internal::write_file_atomic(path, kept); !ok)
    return make_error("train.metrics = \"{}\": {}", path, ok.error().message);
  return dropped;
}

}  // namespace

Expected<int64_t> resume_metrics_file(const std::string& path, int64_t step,
                                      const std::string& checkpoint) {
  return keep_metrics_until(
      path, step, [&](int64_t dropped) { return resumed_json(step, checkpoint, dropped); });
}

Expected<int64_t> restart_metrics_file(const std::string& path) {
  return keep_metrics_until(path, 0, {});
}

std::string migration_json(const MigrationEvent& e) {
  std::string out;
  fmt::format_to(std::back_inserter(out),
                 "{{\"migration\":{{\"step\":{},\"decided\":{},\"forced\":{},\"moved\":{},", e.step,
                 e.decided, e.forced, e.moved);
  out += "\"from\":";
  append_list(out, e.from);
  out += ",\"to\":";
  append_list(out, e.to);
  out += ",\"imbalance\":";
  append_number(out, e.imbalance);
  out += ",\"busy\":";
  append_list(out, e.busy);
  out += ",\"speed\":";
  append_list(out, e.speed);
  out += ",\"predicted_now\":";
  append_number(out, e.predicted_now);
  out += ",\"predicted_new\":";
  append_number(out, e.predicted_new);
  fmt::format_to(std::back_inserter(out),
                 ",\"layers_moved\":{},\"bytes_moved\":{},\"bytes_sent\":{},\"move_seconds\":",
                 e.layers_moved, e.bytes_moved, e.bytes_sent);
  append_seconds(out, e.move_seconds);
  out += ",\"reason\":";
  append_text(out, e.reason);
  out += ",\"error\":";
  append_text(out, e.error);
  out += "}}";
  return out;
}

double StepMetrics::tokens_per_second() const {
  return seconds > 0.0 ? static_cast<double>(tokens) / seconds : 0.0;
}

double StepMetrics::eta_seconds() const {
  const int64_t done = step - first_step;
  if (done <= 0 || steps <= step) return 0.0;
  return seconds / static_cast<double>(done) * static_cast<double>(steps - step);
}

std::string metrics_json(const StepMetrics& m) {
  std::string out;
  fmt::format_to(std::back_inserter(out), "{{\"step\":{},\"loss\":", m.step);
  append_number(out, m.loss);
  fmt::format_to(std::back_inserter(out), ",\"tokens\":{},\"time\":", m.tokens);
  append_seconds(out, m.seconds);
  out += ",\"busy\":[";
  for (size_t r = 0; r < m.stages.size(); ++r) {
    if (r > 0) out += ',';
    append_seconds(out, m.stages[r].busy_seconds);
  }
  out += "],\"idle\":[";
  for (size_t r = 0; r < m.stages.size(); ++r) {
    if (r > 0) out += ',';
    append_seconds(out, m.stages[r].idle_seconds);
  }
  out += "]";
  if (m.skipped) out += ",\"skipped\":true";
  out += "}";
  return out;
}

}  // namespace actorpipe
