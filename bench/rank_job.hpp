// Rank jobs: a benchmark that measures several processes starts its own program as the ranks of
// one local job (actorpipe-launch's process management) and each rank joins it as a ProcessGroup.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "actors/process_group.hpp"
#include "engine/expected.hpp"

namespace actorpipe::bench {

/// What one rank job printed and how it ended.
struct RankJobResult {
  std::vector<std::vector<std::string>> out;  ///< per rank: its standard-output lines
  std::string failure;                        ///< empty, or how the first failing rank ended
};

/// Runs `args` of this program (self_executable()) as ranks 0..world-1 of one local job on
/// 127.0.0.1 (a free port, a fresh job secret: examples/launch/launcher.hpp) and waits for every
/// rank. Their standard error passes through, prefixed "[rank K] "; their standard output is
/// collected. `env` is set on top of this process's environment. Errors: the job could not be
/// planned (no free port, no randomness).
Expected<RankJobResult> run_rank_job(const std::vector<std::string>& args, int world,
                                     const std::vector<std::pair<std::string, std::string>>& env,
                                     double grace_seconds = 10.0);

/// Inside a rank of run_rank_job: joins the job from the launcher's environment (rank, world,
/// coordinator, job secret). Errors: not started as a rank, or the group's own errors.
Expected<std::unique_ptr<ProcessGroup>> join_rank_job(const ProcessGroupOptions& base = {});

/// The first line of `lines` that parses as a JSON object whose "name" is `name`, as text;
/// an error naming `what` and the lines when none does.
Expected<std::string> find_json_line(const std::vector<std::string>& lines, const std::string& name,
                                     const std::string& what);

/// Inside a rank: returns once every rank of `g` has called it (an all-gather of nothing).
Status rank_barrier(ProcessGroup& g);

/// Whether ucx_perftest (package ucx-utils), the peer of the benchmarks between processes, is on
/// PATH.
bool have_ucx_perftest();

}  // namespace actorpipe::bench
