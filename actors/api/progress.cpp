// Progress line: formatting of durations, rates and the per-step line, and the printer that
// rewrites it on a terminal or appends plain lines elsewhere.
#include "actors/api/actorpipe/progress.hpp"

#include <fmt/format.h>

#include <cmath>
#include <iterator>

namespace actorpipe {

std::string format_duration(double seconds) {
  const long s = std::isfinite(seconds) && seconds > 0 ? static_cast<long>(seconds) : 0;
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}:{:02}", s / 60, s % 60);
  return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
}

std::string format_rate(double x) {
  if (!std::isfinite(x) || x < 0) return "0";
  if (x < 999.5) return fmt::format("{:.0f}", x);
  constexpr const char* suffix[] = {"k", "M", "G", "T"};
  for (int i = 0; i < 4; ++i) {
    x /= 1000.0;
    if (x < 999.5 || i == 3) {
      const int decimals = x < 9.995 ? 2 : x < 99.95 ? 1 : 0;
      return fmt::format("{:.{}f}{}", x, decimals, suffix[i]);
    }
  }
  return "0";  // not reached
}

std::string format_progress(const StepMetrics& m, std::optional<double> loss_floor) {
  std::string out = fmt::format("step {}/{}  loss {:.4f}", m.step, m.steps, m.loss);
  if (loss_floor) fmt::format_to(std::back_inserter(out), " (floor {:.4f})", *loss_floor);
  fmt::format_to(std::back_inserter(out), "  {} tok/s", format_rate(m.tokens_per_second()));
  if (!m.stages.empty()) out += "  busy";
  for (const StageMetrics& s : m.stages) {
    const double total = s.busy_seconds + s.idle_seconds;
    const double pct = total > 0 ? 100.0 * s.busy_seconds / total : 0.0;
    fmt::format_to(std::back_inserter(out), " {:.0f}%", pct);
  }
  fmt::format_to(std::back_inserter(out), "  ETA {}", format_duration(m.eta_seconds()));
  if (m.skipped_steps > 0)
    fmt::format_to(std::back_inserter(out), "  skipped {} (non-finite)", m.skipped_steps);
  return out;
}

ProgressPrinter::ProgressPrinter(std::FILE* out, bool tty, int every,
                                 std::optional<double> loss_floor)
    : out_(out), tty_(tty), every_(every), floor_(loss_floor) {}

void ProgressPrinter::step(const StepMetrics& m) {
  if (every_ <= 0) return;
  const bool last = m.step >= m.steps;
  if (tty_) {
    if (!last && last_print_ >= 0 && m.seconds - last_print_ < 0.1) return;
    last_print_ = m.seconds;
    fmt::print(out_, "\r{}\x1b[K", format_progress(m, floor_));
    line_open_ = true;
  } else {
    if (!last && m.step % every_ != 0) return;
    fmt::print(out_, "{}\n", format_progress(m, floor_));
  }
  std::fflush(out_);
}

void ProgressPrinter::finish() {
  if (!line_open_) return;
  fmt::print(out_, "\n");
  std::fflush(out_);
  line_open_ = false;
}

void ProgressPrinter::note(const std::string& line) {
  finish();
  fmt::print(out_, "{}\n", line);
  std::fflush(out_);
}

}  // namespace actorpipe
