// Command line of actorpipe-bench: which shapes and thread counts to measure, how many
// repetitions, whether to run the PyTorch peer, print JSON lines or profile a step.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "bench/cli_args.hpp"
#include "engine/expected.hpp"

namespace actorpipe::bench {

/// With CommonOptions: --json prints one JSON object per line per measurement.
struct BenchOptions : CommonOptions {
  std::vector<std::string> shapes = {"tiny", "small", "gpt2"};  // --shapes a,b
  std::vector<int> threads = {1, 2};                            // --threads 1,2
  /// --precision fp32,bf16: what the products compute in (bf16 needs bf16 instructions)
  std::vector<std::string> precisions = {"fp32", "bf16"};
  int reps = 5;          // --reps N: timed steps per configuration (median reported)
  int warmup = 1;        // --warmup N: untimed steps first (at least 1)
  bool profile = false;  // --profile: per-kernel-category breakdown of a step
  /// Internal: measure shapes[0] at threads[0] in this process and print one JSON line
  /// (the parent runs every configuration in a fresh child for a per-configuration peak RSS).
  bool child = false;  // --child
};

/// Parses argv[1..]; errors name the option, the value and what is allowed.
Expected<BenchOptions> parse_bench_options(std::span<const std::string> args);

/// The --help text.
std::string bench_usage();

}  // namespace actorpipe::bench
