// PyTorch peer: runs bench/peers/torch_step.py for one configuration in a child process
// with the thread settings of that configuration and reads back its JSON line.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "bench/bench_shapes.hpp"
#include "engine/options.hpp"

namespace actorpipe::bench {

struct PeerResult {
  bool ran = false;      // a measurement came back
  bool missing = false;  // torch (or the interpreter) is not installed
  std::string error;     // why there is no measurement
  std::string torch_version;
  std::string attention;  // how the peer computes attention
  long parameters = 0;
  double first_loss = 0.0;
  double step_ms = 0.0;
  double tokens_per_s = 0.0;
  double peak_rss_mb = 0.0;
  double import_rss_mb = 0.0;  // RSS right after `import torch`
};

/// The environment the peer runs with at `threads`: OMP_NUM_THREADS and
/// OPENBLAS_NUM_THREADS = threads, and from 2 threads on OMP_WAIT_POLICY=PASSIVE and
/// OPENBLAS_THREAD_TIMEOUT=4 (idle OpenMP/OpenBLAS threads sleep instead of spinning on a
/// machine with as many cores as threads).
std::vector<std::pair<std::string, std::string>> peer_environment(int threads);

/// "OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 ... python3 torch_step.py ... --threads 2"
/// (the script then calls torch.set_num_threads(threads)).
std::string describe_peer_command(const std::string& python, const std::string& script,
                                  int threads);

/// Runs the peer for `shape` at `threads` with the same optimizer options, reps and
/// warm-up as actorpipe's measurement.
PeerResult run_torch_peer(const std::string& python, const std::string& script,
                          const BenchShape& shape, const OptimizerOptions& opt, int threads,
                          int reps, int warmup);

}  // namespace actorpipe::bench
