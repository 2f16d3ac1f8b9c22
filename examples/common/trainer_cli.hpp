// Trainer command line shared by actorpipe-gpt and actorpipe-bert: --config FILE, repeated
// --set section.key=value, --backend, --rank/--world/--coordinator; progress line, summary, exit
// codes 0 / 1 / 2.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/expected.hpp"
#include "engine/options.hpp"
#include "engine/sampling/sampler.hpp"
#include "transport/cluster_env.hpp"

namespace actorpipe {

/// What differs between the example trainers.
struct TrainerProgram {
  std::string_view name;            ///< "actorpipe-gpt"
  Arch arch = Arch::gpt;            ///< the architecture the program trains
  std::string_view default_config;  ///< TOML used when no --config is given
};

/// --sample and its options: generate from a checkpoint instead of training.
struct SampleArgs {
  bool enabled = false;
  std::string checkpoint;  ///< --checkpoint; empty: checkpoint.resume, else checkpoint.dir
  std::string prompt;      ///< --prompt: text (data.kind = "text") or token ids ("3 17 5")
  bool prompt_given = false;
  SampleOptions options;  ///< --tokens, --temperature, --top-k, --seed
};

/// The parsed command line.
struct CliArgs {
  std::string config_path;        ///< --config; empty = the embedded default
  std::vector<std::string> sets;  ///< every --set, in order
  std::string backend = "actors";
  ClusterFlags cluster;  ///< --rank, --world, --coordinator (override the launcher's variables)
  bool print_config = false;
  bool help = false;
  SampleArgs sample;
};

/// Parses argv (argv[0] is skipped). Errors say which argument is wrong and what is expected.
Expected<CliArgs> parse_cli(int argc, const char* const* argv);

/// The --help text.
std::string cli_usage(const TrainerProgram& program);

/// The whole program: parse, load the config, train with a progress line, print a summary.
/// Returns the exit code: 0 done, 1 config / data / checkpoint / training error, 2 bad argument.
int trainer_main(int argc, const char* const* argv, const TrainerProgram& program);

}  // namespace actorpipe
