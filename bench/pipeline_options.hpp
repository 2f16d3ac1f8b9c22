// Command line of `actorpipe-bench pipeline`: the shape, modes and microbatches of the pipeline
// benchmark, repetitions, partition, overhead runs, the GPipe peer and the output format.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "bench/cli_args.hpp"
#include "engine/expected.hpp"
#include "engine/mode.hpp"

namespace actorpipe::bench {

/// With CommonOptions: the peer is PyTorch's GPipe, --json prints JSON lines instead of tables.
struct PipelineBenchOptions : CommonOptions {
  std::string shape = "small";  ///< --shape NAME (bench_shapes(): tiny, small, gpt2)
  std::vector<Mode> modes = {all_modes.begin(), all_modes.end()};  ///< --modes a,b
  int microbatches = 8;        ///< --microbatches M: m per optimizer step
  int reps = 3;                ///< --reps N: timed steps per configuration (median reported)
  int warmup = 1;              ///< --warmup N: untimed steps first (at least 1)
  bool warmup_given = false;   ///< --warmup was on the command line
  std::vector<int> partition;  ///< --partition a,b: layers per stage of the 2-stage runs;
                               ///< empty = balanced from the per-layer profile
  int overhead_steps = 100;    ///< --overhead-steps N: steps of each compute-free run (0 = none)
  bool overhead_only = false;  ///< --overhead-only: the profile and the compute-free runs only
  int profile_reps = 3;        ///< --profile-reps N: timed calls per layer and pass
  int correction_rounds = 0;   ///< --corrections N: rounds of the delay-correction rows (0 = none)
  /// --only-corrections a,b: the corrections of those rows (empty = every one a mode takes;
  /// "none", the reference, is always measured)
  std::vector<std::string> only_corrections;
  int precision_rounds = 0;  ///< --precisions N: rounds of the fp32 / bf16 rows (0 = none)
};

/// Untimed steps of the delay-correction rows when --warmup is not given: with one, 2bw with
/// basis rotation measured up to 1.13× of its uncorrected run, whose timed steps 2-4 were
/// faster than its later ones (docs/benchmarks.md, "A B B A order, three warm-up steps").
inline constexpr int kCorrectionWarmup = 3;

/// The untimed steps of the --corrections rows: --warmup when given, else kCorrectionWarmup.
int correction_warmup(const PipelineBenchOptions& o);

/// Parses the arguments after `pipeline`; errors name the option, the value and what is allowed.
Expected<PipelineBenchOptions> parse_pipeline_options(std::span<const std::string> args);

/// The `actorpipe-bench pipeline --help` text.
std::string pipeline_usage();

}  // namespace actorpipe::bench
