// `actorpipe-bench recompute`: a GPT pipeline trained with pipeline.recompute = none, auto
// (under a memory limit that binds) and all, each in a fresh process: peak memory and step time.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "bench/cli_args.hpp"
#include "engine/expected.hpp"
#include "engine/mode.hpp"

namespace actorpipe::bench {

/// With CommonOptions (its peer options are unused: the peer is recompute = none).
struct RecomputeBenchOptions : CommonOptions {
  std::string shape = "small";  ///< --shape NAME (bench_shapes(): tiny, small, gpt2)
  Mode mode = Mode::gpipe;      ///< --mode: gpipe stashes all m microbatches at every stage
  int stages = 2;               ///< --stages D
  int microbatches = 4;         ///< --microbatches M: m per optimizer step
  int threads = 1;              ///< --threads N: per stage
  int reps = 3;                 ///< --reps N: timed steps per run
  int warmup = 1;               ///< --warmup N: untimed steps first (at least 1)
  int rounds = 3;               ///< --rounds N: runs of each configuration, alternating
  /// --limit-mb N: pipeline.memory_limit_mb for "auto"; 0 = three quarters of the largest
  /// stage the planner predicts without recompute (rounded down to whole MiB, at least 1)
  int limit_mb = 0;
  int profile_reps = 3;   ///< --profile-reps N: the planner's layer profile
  std::string cache_dir;  ///< --cache-dir DIR: the profile cache (default: the planner's)
  /// --child LAYERS (internal): run one configuration here ("none", "all" or a comma list of
  /// layers) and print one JSON line.
  std::string child;
};

/// Parses the arguments after `recompute`; errors name the option, the value and what is
/// allowed.
Expected<RecomputeBenchOptions> parse_recompute_options(std::span<const std::string> args);

/// The `actorpipe-bench recompute --help` text.
std::string recompute_usage();

/// Runs `actorpipe-bench recompute` with `args` (after `recompute`); returns the exit code.
int run_recompute_bench(std::span<const std::string> args);

}  // namespace actorpipe::bench
