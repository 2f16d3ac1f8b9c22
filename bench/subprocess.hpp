// Subprocess: runs a program with extra environment variables and captures its standard
// output (standard error passes through), for the per-configuration child and the peer.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/expected.hpp"

namespace actorpipe::bench {

struct ProcessResult {
  int exit_code = 0;  // exit status, or 128 + signal number when killed by a signal
  std::string out;    // everything written to standard output
};

/// Runs argv[0] (searched on PATH when it has no slash) with argv, in the current
/// environment with `env` set on top (replacing variables of the same name). Waits for it.
/// An error only when the program could not be started.
Expected<ProcessResult> run_process(const std::vector<std::string>& argv,
                                    const std::vector<std::pair<std::string, std::string>>& env);

/// The path of the running program (/proc/self/exe).
std::string self_executable();

/// The peer script `file` of bench/peers/ (torch_step.py, torch_pipe.py, ucx_perftest_pair.sh):
/// `given` when it is not empty (a --peer-script option), else under $ACTORPIPE_SOURCE_DIR, else
/// in the source tree this program was built from.
std::string peer_script_path(const std::string& given, const std::string& file);

}  // namespace actorpipe::bench
