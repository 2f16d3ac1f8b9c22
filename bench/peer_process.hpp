// PyTorch peer processes: the thread environment a peer script runs with, its command line and
// one run of it as a child process whose last JSON line is its answer.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_shapes.hpp"
#include "engine/options.hpp"

namespace actorpipe::bench {

/// The environment the peer runs with at `threads`: OMP_NUM_THREADS and
/// OPENBLAS_NUM_THREADS = threads, and from 2 threads on OMP_WAIT_POLICY=PASSIVE and
/// OPENBLAS_THREAD_TIMEOUT=4 (idle OpenMP/OpenBLAS threads sleep instead of spinning on a
/// machine with as many cores as threads). With `blas_core` (the core this process switched
/// OpenBLAS to, peer_blas_core()) also OPENBLAS_CORETYPE = blas_core: PyTorch's products run
/// on the same OpenBLAS, which picks the same narrow kernels in the peer.
std::vector<std::pair<std::string, std::string>> peer_environment(int threads,
                                                                  const std::string& blas_core);
std::vector<std::pair<std::string, std::string>> peer_environment(int threads);

/// The OpenBLAS core use_fitting_blas_core() switched this process to, where it did and
/// OPENBLAS_CORETYPE is unset; else empty.
std::string peer_blas_core();

/// `python script --vocab=.. --context=.. --width=.. --depth=.. --heads=.. --batch=B --seq=T`,
/// then `extra`, then `--threads=.. --reps=.. --warmup=..` and the optimizer's --lr, --beta1,
/// --beta2, --eps, --weight-decay and --grad-clip.
std::vector<std::string> peer_argv(const std::string& python, const std::string& script,
                                   const BenchShape& shape, const std::vector<std::string>& extra,
                                   const OptimizerOptions& opt, int threads, int reps, int warmup);

/// Whether a peer run measured anything, and if not, why.
struct PeerStatus {
  bool ran = false;      ///< a measurement came back
  bool missing = false;  ///< the script, the interpreter or torch is not installed
  std::string error;     ///< why there is no measurement
};

/// Runs `argv` (argv[0] the interpreter, argv[1] the script) with peer_environment(threads).
/// Its answer is the last line of its output that is a JSON object; when that says
/// {"ok": true, ...}, `read` takes the measurement out of it and `status.ran` is set, unless a
/// field is missing or mistyped ("unexpected peer output: ..."). Missing: an unreadable script,
/// an interpreter that cannot be started or exits 127, or a peer answering
/// {"ok": false, "missing": true}; any other failure is named in `status.error`.
void run_peer(const std::vector<std::string>& argv, int threads, PeerStatus& status,
              const std::function<void(const nlohmann::json&)>& read);

}  // namespace actorpipe::bench
