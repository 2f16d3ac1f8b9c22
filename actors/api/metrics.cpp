// Metrics: derived rates of a step and its one-line JSON form (the loss as the shortest text that
// reads back to the same double, so the file loses no precision; times to the microsecond).
#include "actors/api/actorpipe/metrics.hpp"

#include <fmt/format.h>

#include <cmath>
#include <iterator>

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

}  // namespace

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
  out += "]}";
  return out;
}

}  // namespace actorpipe
