// Variant rows of the pipeline benchmark: one pipeline configuration measured in several
// variants (a delay correction, a precision), the variants interleaved round by round so that a
// noisy machine slows them alike, in an order that turns round every other round so that no
// variant always runs first or after the same one; tokens/s per round and the last run's result
// per variant.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "bench/bench_shapes.hpp"
#include "bench/pipeline_timing.hpp"

namespace actorpipe::bench {

/// A named change of the base spec.
struct Variant {
  std::string label;
  std::function<void(PipelineRunSpec&)> apply;
};

/// What one variant measured: tokens/s of every round, the last round's result, or why it
/// failed (a failed variant is not run again).
struct VariantResult {
  std::vector<double> tokens_per_s;
  PipelineRunResult last;
  std::string error;
  bool ok() const { return error.empty(); }
  /// Median tokens/s (0 when it failed).
  double median_tokens_per_s() const;
};

/// The base of a mode's variant rows: `shape`'s GPT in `mode` on 2 stages of `counts` layers,
/// m microbatches a step, `warmup` + `reps` steps per run.
PipelineRunSpec two_stage_spec(const BenchShape& shape, Mode mode, const std::vector<int>& counts,
                               int m, int warmup, int reps);

/// The order of the variants in round `round` (from 0) of n: 0, 1, ..., n − 1 in even rounds
/// and n − 1, ..., 0 in odd ones (A B B A ...): a drift of the machine within a round, or a cost
/// that a run leaves to the next, then falls on every variant alike over two rounds.
std::vector<size_t> variant_order(int round, size_t n);

/// Runs `rounds` rounds, each measuring every variant of `base` once, in variant_order.
std::vector<VariantResult> run_variants(const PipelineRunSpec& base,
                                        const std::vector<Variant>& variants, int rounds);

}  // namespace actorpipe::bench
