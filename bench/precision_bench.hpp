// The precisions in the pipeline benchmark (`actorpipe-bench pipeline --precisions`): every mode
// on two stages × 1 thread in fp32 and in bf16 (pipeline.precision), interleaved round by round:
// tokens/s (median) and the ratio bf16 / fp32.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "bench/bench_shapes.hpp"
#include "engine/mode.hpp"

namespace actorpipe::bench {

/// Runs the rows for `modes` on 2 stages of `counts` layers, m microbatches, `warmup` + `reps`
/// steps per run, `rounds` rounds; prints a table (or JSON lines with `as_json`) through `out`.
/// On a CPU without bf16 instructions it says so and measures nothing. Returns the number of
/// failed measurements.
int run_precision_rows(const BenchShape& shape, std::span<const Mode> modes,
                       const std::vector<int>& counts, int m, int warmup, int reps, int rounds,
                       bool as_json, const std::function<void(const std::string&)>& out);

}  // namespace actorpipe::bench
