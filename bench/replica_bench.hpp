// `actorpipe-bench replicas`: GPT on two processes as two replicas of one stage (w 2 × d 1) and
// as one pipeline of two stages (w 1 × d 2), beside the same pipeline in one process; each
// configuration's tokens/s with the width × depth planner's prediction, the planner's choice,
// and how much of the replicas' all-reduce the backward hides.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "bench/cli_args.hpp"
#include "engine/expected.hpp"
#include "engine/mode.hpp"

namespace actorpipe::bench {

/// With CommonOptions (its peer options are unused: the peer is the in-process engine).
struct ReplicaBenchOptions : CommonOptions {
  std::string shape = "small";     ///< --shape NAME (bench_shapes(): tiny, small, gpt2)
  Mode mode = Mode::onef1b;        ///< --mode: gpipe, 1f1b or 2bw
  int microbatches = 8;            ///< --microbatches M: per step, all replicas together
  int reps = 3;                    ///< --reps N: timed steps per run
  int warmup = 1;                  ///< --warmup N: untimed steps first
  int repeats = 2;                 ///< --repeats N: runs of each configuration, alternating
  int profile_reps = 3;            ///< --profile-reps N: the planner's layer profile
  double allreduce_bandwidth = 0;  ///< --allreduce-bandwidth B: bytes/s; 0 = measured here
  /// --rank-child local|ranks (internal), with --replicas, --stages and --partition.
  std::string rank_child;
  int replicas = 1;
  int stages = 2;
  std::vector<int> partition;
};

/// Parses the arguments after `replicas`; errors name the option, the value and what is
/// allowed.
Expected<ReplicaBenchOptions> parse_replica_options(std::span<const std::string> args);

/// The `actorpipe-bench replicas --help` text.
std::string replica_usage();

/// Runs `actorpipe-bench replicas` with `args` (after `replicas`); returns the exit code.
int run_replica_bench(std::span<const std::string> args);

}  // namespace actorpipe::bench
