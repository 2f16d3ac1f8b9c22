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
  std::string precision = "fp32";        ///< --precision: pipeline.precision
  std::string stash_precision = "fp32";  ///< --stash-precision: pipeline.stash_precision
  int profile_reps = 3;                  ///< --profile-reps N: the planner's layer profile
  std::string cache_dir;  ///< --cache-dir DIR: the profile cache (default: the planner's)
  /// --child LAYERS (internal): run one configuration here ("none", "all" or a comma list of
  /// layers) and print one JSON line.
  std::string child;
};

/// Parses the arguments after `recompute` over `defaults`; errors name the option, the value and
/// what is allowed.
Expected<RecomputeBenchOptions> parse_recompute_options(std::span<const std::string> args,
                                                        RecomputeBenchOptions defaults = {});

/// One configuration trained in a fresh process (this executable's `recompute --child`): what
/// it measured.
struct MeasuredRun {
  std::vector<int> layers;  ///< recomputed
  std::vector<double> step_seconds;
  double stash_bytes = 0, scratch_bytes = 0, max_rss_bytes = 0;
  double weight_bytes = 0;  ///< Σ StageWorker::weight_bytes() at the end of the run
  std::vector<double> losses;
};

/// Runs `o`'s pipeline with pipeline.recompute = `layers` ("none", "all" or a list) in a fresh
/// process and reads its measurement.
Expected<MeasuredRun> measure_in_child(const RecomputeBenchOptions& o, const std::string& layers);

/// The `actorpipe-bench recompute --help` text.
std::string recompute_usage();

/// Runs `actorpipe-bench recompute` with `args` (after `recompute`); returns the exit code.
int run_recompute_bench(std::span<const std::string> args);

}  // namespace actorpipe::bench
