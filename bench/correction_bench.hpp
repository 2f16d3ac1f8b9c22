// The delay corrections in the pipeline benchmark (`actorpipe-bench pipeline --corrections`):
// each asynchronous mode on two stages × 1 thread without and with each correction
// (optimizer.delay_correction), the configurations of a mode interleaved round by round so that
// a noisy machine slows them alike: tokens/s (median), the ratio to the uncorrected mode, the
// floats its stages keep for the correction, and the time of one update of the whole model's
// parameters with and without it.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "bench/bench_shapes.hpp"
#include "engine/mode.hpp"

namespace actorpipe::bench {

/// The corrections a mode takes: none, nesterov, nadam, and dc except in xpipe (refused there).
/// "nadam" is nesterov with NAdam's momentum schedule (optimizer.momentum_decay = 0.004, torch's
/// default); the other names are optimizer.delay_correction's values.
std::vector<std::string> corrections_of(Mode mode);

/// The optimizer settings of a correction's name: optimizer.delay_correction and
/// optimizer.momentum_decay.
struct CorrectionSettings {
  std::string delay_correction;
  float momentum_decay = 0.0f;
};
CorrectionSettings correction_settings(const std::string& name);

/// One update of `n` parameters (AdamW, whole-buffer kernels at 1 thread) with `correction`,
/// dc including its Δ pass (the subtraction of two versions): the median of `reps` calls, in
/// seconds.
double update_seconds(size_t n, const std::string& correction, int reps);

/// Runs the rows for the asynchronous modes of `modes` on 2 stages of `counts` layers, m
/// microbatches, `warmup` + `reps` steps per run, `rounds` rounds; prints a table (or JSON lines
/// with `as_json`) through `out`. Returns the number of failed measurements.
int run_correction_rows(const BenchShape& shape, std::span<const Mode> modes,
                        const std::vector<int>& counts, int m, int warmup, int reps, int rounds,
                        bool as_json, const std::function<void(const std::string&)>& out);

}  // namespace actorpipe::bench
