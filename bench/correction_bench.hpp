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
#include "engine/model/model.hpp"

namespace actorpipe::bench {

/// The corrections a mode takes: none, nesterov, nadam, the compensations (dc, secant, and with
/// the look-ahead) except in xpipe (refused there), and rot, rot+nesterov, rot32,
/// rot32+nesterov. "nadam" is nesterov
/// with NAdam's momentum schedule (optimizer.momentum_decay = 0.004, torch's default); "rot" is
/// optimizer.basis_rotation (with none or nesterov), "rot32" the same in blocks of 32
/// (optimizer.rotation_block); the other names are optimizer.delay_correction's values.
std::vector<std::string> corrections_of(Mode mode);

/// The optimizer settings of a correction's name: optimizer.delay_correction,
/// optimizer.momentum_decay, optimizer.basis_rotation and optimizer.rotation_block.
struct CorrectionSettings {
  std::string delay_correction;
  float momentum_decay = 0.0f;
  bool basis_rotation = false;
  int rotation_block = 0;
};
CorrectionSettings correction_settings(const std::string& name);

/// One update of every layer of `model` (optimizer_update, AdamW at `threads` threads, as a
/// stage calls it) with `correction`, the compensations including their Δ pass (the subtraction of
/// two versions): the median of `reps` updates, in seconds. The update is at step 11 and later:
/// with basis rotation every rotation_every-th (the default, 10) refreshes its eigenvectors, so
/// the median is the update between refreshes; refreshing_update_seconds gives one that
/// refreshes.
double update_seconds(const Model& model, const std::string& correction, int reps, int threads = 1);

/// basis rotation: one update of every layer of `model` that refreshes the eigenvectors (steps
/// 11, 21, ...), with `correction`'s rotation (rot, rot32): the median of `reps`, in seconds.
/// Reported as it is, not as a difference from update_seconds (two medians of a noisy machine
/// whose difference could come out negative).
double refreshing_update_seconds(const Model& model, const std::string& correction, int reps);

/// The corrections of `mode` that its rows measure: corrections_of(mode), or with `only`
/// non-empty those of them in `only`, with "none" (the reference) first either way.
std::vector<std::string> measured_corrections(Mode mode, std::span<const std::string> only);

/// Runs the rows for the asynchronous modes of `modes` on 2 stages of `counts` layers, m
/// microbatches, `warmup` + `reps` steps per run, `rounds` rounds, with
/// measured_corrections(mode, only); prints a table (or JSON lines with `as_json`) through
/// `out`. Returns the number of failed measurements.
int run_correction_rows(const BenchShape& shape, std::span<const Mode> modes,
                        const std::vector<int>& counts, int m, int warmup, int reps, int rounds,
                        std::span<const std::string> only, bool as_json,
                        const std::function<void(const std::string&)>& out);

}  // namespace actorpipe::bench
