// Progress line: step, loss, tokens/s, per-stage busy %, ETA. Rewritten in place with \r on a
// terminal, one plain line per reported step otherwise (logs, pipes, CI).
#pragma once

#include <cstdio>
#include <optional>
#include <string>

#include "metrics.hpp"

namespace actorpipe {

/// "42s", "3:05", "1:02:03" (rounded down to whole seconds; negative counts as 0).
std::string format_duration(double seconds);

/// "950", "12.3k", "4.56M": a rate with three significant digits and an SI suffix.
std::string format_rate(double per_second);

/// The progress line of a step, e.g.
///   step 120/300  loss 1.2345 (floor 1.0920)  12.3k tok/s  busy 87% 91%  ETA 1:05
/// The floor part appears only with `loss_floor`; busy % is busy / (busy + idle) per stage, left
/// out when the metrics have no stage times (the serial backend); "  skipped 3 (non-finite)" ends
/// it once steps were dropped (train.nonfinite = "skip").
std::string format_progress(const StepMetrics& metrics,
                            std::optional<double> loss_floor = std::nullopt);

/// Prints progress lines to a stream. On a terminal (tty) the line is rewritten in place
/// ("\r" + line + "\x1b[K", at most ten times a second and always for the last step) and
/// finish() ends it; otherwise every `every`-th step and the last step get their own line.
/// every = 0 prints nothing.
class ProgressPrinter {
 public:
  ProgressPrinter(std::FILE* out, bool tty, int every,
                  std::optional<double> loss_floor = std::nullopt);
  /// Reports a step (call after every step, in order).
  void step(const StepMetrics& metrics);
  /// Ends a rewritten line with a newline (nothing to do otherwise). Safe to call twice.
  void finish();
  /// Prints `line` on a line of its own between the step reports (after finish()).
  void note(const std::string& line);

 private:
  std::FILE* out_;
  bool tty_;
  int every_;
  std::optional<double> floor_;
  bool line_open_ = false;
  double last_print_ = -1.0;  // StepMetrics::seconds of the last rewrite
};

}  // namespace actorpipe
