// `actorpipe-bench pipeline`: pipeline efficiency of the actor engine per mode on this machine,
// PyTorch's GPipe peer, the engine's overhead and the simulator's predictions; tables or JSON.
#pragma once

#include <span>
#include <string>

namespace actorpipe::bench {

/// Runs the pipeline benchmark with the arguments that follow `pipeline` on the command line
/// (bench/pipeline_options.hpp) and prints its report to standard output (warnings and errors
/// to standard error). Returns the exit status: 0, 1 when a measurement failed, 2 for bad
/// arguments.
int run_pipeline_bench(std::span<const std::string> args);

}  // namespace actorpipe::bench
