// `actorpipe-bench migration`: the migration manager at work — a bad partition, and a good one
// whose second stage slows down mid-run — beside the planner's static optimum run the same way.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "bench/cli_args.hpp"
#include "engine/expected.hpp"
#include "engine/mode.hpp"

namespace actorpipe::bench {

/// With CommonOptions (the peer options are unused: the peer is the static optimum).
struct MigrationBenchOptions : CommonOptions {
  std::string shape = "small";                            ///< --shape NAME (bench_shapes())
  std::vector<Mode> modes = {Mode::onef1b, Mode::twobw};  ///< --modes a,b
  std::vector<std::string> scenarios = {"bad", "slow"};   ///< --scenarios bad,slow
  int microbatches = 4;                                   ///< --microbatches M
  int steps = 12;                                         ///< --steps N: optimizer steps per run
  int check_every = 2;    ///< --check-every N: migration.check_every
  double slowdown = 2.0;  ///< --slowdown X: stage 1 computes X times slower ("slow")
  int slow_from = 4;      ///< --slow-from N: ... from step N on
  int repeats = 2;        ///< --repeats N: runs of each configuration, alternating
};

/// Parses the arguments after `migration`; errors name the option, the value and what is
/// allowed.
Expected<MigrationBenchOptions> parse_migration_options(std::span<const std::string> args);

/// The `actorpipe-bench migration --help` text.
std::string migration_usage();

/// Runs `actorpipe-bench migration` with `args` (after `migration`); returns the exit code.
int run_migration_bench(std::span<const std::string> args);

}  // namespace actorpipe::bench
