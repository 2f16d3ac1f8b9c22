// `actorpipe-bench stash`: a bf16 pipeline trained with pipeline.stash_precision = fp32 and
// bf16, each run in a fresh process: the weights' bytes and the peak memory the bf16 stash saves.
#pragma once

#include <span>
#include <string>

#include "bench/recompute_bench.hpp"
#include "engine/expected.hpp"

namespace actorpipe::bench {

/// The recompute bench's options (recompute none), defaulting to 2bw in bf16.
Expected<RecomputeBenchOptions> parse_stash_options(std::span<const std::string> args);

/// The `actorpipe-bench stash --help` text.
std::string stash_usage();

/// Runs `actorpipe-bench stash` with `args` (after `stash`); returns the exit code.
int run_stash_bench(std::span<const std::string> args);

}  // namespace actorpipe::bench
