// `actorpipe-bench update`: the per-step work on the weights outside the products, measured on a
// benchmark shape's real parameter layout: the optimizer update, the gradients' fill and (bf16)
// the conversions of the new version's weights for the products, as separate passes (the peer:
// how the engine did it before) against the fused update that does all of it in one pass.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "bench/bench_options.hpp"
#include "engine/expected.hpp"

namespace actorpipe::bench {

/// One configuration's timings, in milliseconds per update (every rep, in order).
struct UpdateTiming {
  std::string shape, precision;
  int threads = 1;
  long parameters = 0;
  std::vector<double> separate_ms, fused_ms;
  bool same_bits = false;  ///< both ways left the same weights and optimizer state
};

/// Measures one configuration: `reps` updates each way, alternating, on the gradients of one
/// microbatch (restored before every update, untimed).
Expected<UpdateTiming> time_update(const std::string& shape, int threads,
                                   const std::string& precision, int reps);

/// The `actorpipe-bench update --help` text.
std::string update_usage();

/// Runs `actorpipe-bench update` with `args` (after `update`); returns the exit code.
int run_update_bench(std::span<const std::string> args);

}  // namespace actorpipe::bench
