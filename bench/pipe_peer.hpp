// GPipe peer: runs bench/peers/torch_pipe.py (PyTorch's Pipe with 2 partitions and the unsplit
// model, same GPT, m chunks) in a child process with one thread setting, reads its JSON line.
#pragma once

#include <string>
#include <vector>

#include "bench/bench_shapes.hpp"
#include "bench/peer_process.hpp"
#include "engine/options.hpp"

namespace actorpipe::bench {

/// One way the peer trained a step of m microbatches.
struct PipePeerVariant {
  std::vector<double> step_ms_all;
  double step_ms = 0.0;  ///< median
  double tokens_per_s = 0.0;
  double first_loss = 0.0;
};

/// ran, missing (torch, its Pipe or the interpreter is not installed) and error: PeerStatus.
struct PipePeerResult : PeerStatus {
  int threads = 0;  ///< torch.get_num_threads() in the peer
  std::string torch_version;
  std::string attention;
  long parameters = 0;
  int partitions = 0;       ///< Pipe's partitions (2)
  PipePeerVariant unsplit;  ///< the plain model, gradient accumulation over m microbatches
  PipePeerVariant pipe;     ///< Pipe(chunks = m, checkpoint = "never")
};

/// The peer's command line for `threads`, environment first (peer_environment), as run.
std::vector<std::string> pipe_peer_argv(const std::string& python, const std::string& script,
                                        const BenchShape& shape, const OptimizerOptions& opt,
                                        int microbatches, int split, int threads, int reps,
                                        int warmup);
std::string describe_pipe_peer_command(const std::vector<std::string>& argv, int threads);

/// Runs the peer: `split` layers (embedding, blocks, head each count 1) in the first partition,
/// m = `microbatches` chunks of shape.B sequences, `reps` timed steps after `warmup`.
PipePeerResult run_pipe_peer(const std::string& python, const std::string& script,
                             const BenchShape& shape, const OptimizerOptions& opt, int microbatches,
                             int split, int threads, int reps, int warmup);

}  // namespace actorpipe::bench
