// `actorpipe-bench processes`: a GPT pipeline of two stages as two processes against the same two
// stages in one process, every mode: tokens/s and the engine's compute-free cost per microbatch.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "bench/cli_args.hpp"
#include "engine/expected.hpp"
#include "engine/mode.hpp"

namespace actorpipe::bench {

/// With CommonOptions (its peer options are unused: the peer is the in-process engine).
struct ProcessBenchOptions : CommonOptions {
  std::string shape = "small";  ///< --shape NAME (bench_shapes(): tiny, small, gpt2)
  std::vector<Mode> modes = {all_modes.begin(), all_modes.end()};  ///< --modes a,b
  int microbatches = 8;        ///< --microbatches M: m per optimizer step
  int reps = 3;                ///< --reps N: timed steps per run
  int warmup = 1;              ///< --warmup N: untimed steps first (at least 1)
  int repeats = 2;             ///< --repeats N: runs of each configuration, alternating
  std::vector<int> partition;  ///< --partition a,b: layers per stage; empty = the engine's
  int overhead_steps = 100;    ///< --overhead-steps N: steps of each compute-free run (0: none)
  bool training = true;        ///< --no-training: only the compute-free runs
  /// --rank-child KIND (internal): "local" runs the configuration in this process, "ranks" as a
  /// rank of a job; --mode and --skip-compute say which configuration.
  std::string rank_child;
  Mode mode = Mode::onef1b;   ///< --mode (internal)
  bool skip_compute = false;  ///< --skip-compute (internal)
};

/// Parses the arguments after `processes`; errors name the option, the value and what is
/// allowed.
Expected<ProcessBenchOptions> parse_process_options(std::span<const std::string> args);

/// The `actorpipe-bench processes --help` text.
std::string process_usage();

/// Runs `actorpipe-bench processes` with `args` (after `processes`); returns the exit code.
int run_process_bench(std::span<const std::string> args);

}  // namespace actorpipe::bench
