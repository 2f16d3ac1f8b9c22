// PyTorch peer: runs bench/peers/torch_step.py for one configuration in a child process
// with the thread settings of that configuration and reads back its JSON line.
#pragma once

#include <string>
#include <vector>

#include "bench/bench_shapes.hpp"
#include "bench/peer_process.hpp"
#include "engine/options.hpp"

namespace actorpipe::bench {

/// ran, missing (torch or the interpreter is not installed) and error: PeerStatus.
struct PeerResult : PeerStatus {
  std::string torch_version;
  std::string attention;  // how the peer computes attention
  long parameters = 0;
  double first_loss = 0.0;
  double step_ms = 0.0;
  double tokens_per_s = 0.0;
  double peak_rss_mb = 0.0;
  double import_rss_mb = 0.0;  // RSS right after `import torch`
};

/// "OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 ... python3 torch_step.py ... --threads 2"
/// (the script then calls torch.set_num_threads(threads)); with bf16, "--bf16" (its forward
/// under torch.autocast(cpu, bfloat16)).
std::string describe_peer_command(const std::string& python, const std::string& script, int threads,
                                  bool bf16 = false);

/// Runs the peer for `shape` at `threads` with the same optimizer options, reps and
/// warm-up as actorpipe's measurement; bf16: PyTorch's CPU bf16 autocast.
PeerResult run_torch_peer(const std::string& python, const std::string& script,
                          const BenchShape& shape, const OptimizerOptions& opt, int threads,
                          int reps, int warmup, bool bf16 = false);

}  // namespace actorpipe::bench
