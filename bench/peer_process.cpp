// PyTorch peer processes: the thread environment a peer script runs with, its command line and
// one run of it as a child process whose last JSON line is its answer.
#include "bench/peer_process.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>

#include "bench/subprocess.hpp"
#include "kernels/blas_core.hpp"

namespace actorpipe::bench {

std::vector<std::pair<std::string, std::string>> peer_environment(int threads,
                                                                  const std::string& blas_core) {
  const std::string t = std::to_string(threads);
  std::vector<std::pair<std::string, std::string>> env = {{"OMP_NUM_THREADS", t},
                                                          {"OPENBLAS_NUM_THREADS", t}};
  if (threads >= 2) {
    env.emplace_back("OMP_WAIT_POLICY", "PASSIVE");
    env.emplace_back("OPENBLAS_THREAD_TIMEOUT", "4");
  }
  if (!blas_core.empty()) env.emplace_back("OPENBLAS_CORETYPE", blas_core);
  return env;
}

std::vector<std::pair<std::string, std::string>> peer_environment(int threads) {
  return peer_environment(threads, peer_blas_core());
}

std::string peer_blas_core() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return {};
  const BlasCore core = blas_core();
  return core.picked_at_load.empty() ? std::string() : core.name;
}

std::vector<std::string> peer_argv(const std::string& python, const std::string& script,
                                   const BenchShape& shape, const std::vector<std::string>& extra,
                                   const OptimizerOptions& opt, int threads, int reps, int warmup) {
  const ModelOptions& m = shape.model;
  std::vector<std::string> argv = {python,
                                   script,
                                   "--vocab=" + std::to_string(m.vocab_size),
                                   "--context=" + std::to_string(m.context),
                                   "--width=" + std::to_string(m.width),
                                   "--depth=" + std::to_string(m.depth),
                                   "--heads=" + std::to_string(m.heads),
                                   "--batch=" + std::to_string(shape.B),
                                   "--seq=" + std::to_string(shape.T)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const std::vector<std::string> run = {"--threads=" + std::to_string(threads),
                                        "--reps=" + std::to_string(reps),
                                        "--warmup=" + std::to_string(warmup),
                                        fmt::format("--lr={}", opt.lr),
                                        fmt::format("--beta1={}", opt.beta1),
                                        fmt::format("--beta2={}", opt.beta2),
                                        fmt::format("--eps={}", opt.eps),
                                        fmt::format("--weight-decay={}", opt.weight_decay),
                                        fmt::format("--grad-clip={}", opt.grad_clip)};
  argv.insert(argv.end(), run.begin(), run.end());
  return argv;
}

void run_peer(const std::vector<std::string>& argv, int threads, PeerStatus& status,
              const std::function<void(const nlohmann::json&)>& read) {
  const std::string& script = argv.at(1);
  if (access(script.c_str(), R_OK) != 0) {
    status.missing = true;
    status.error = fmt::format("peer script {} not found (use --peer-script)", script);
    return;
  }
  auto proc = run_process(argv, peer_environment(threads));
  if (!proc) {
    status.missing = true;
    status.error = proc.error().message;
    return;
  }
  // The last line that parses as a JSON object is the peer's answer.
  nlohmann::json j;
  std::istringstream lines(proc->out);
  for (std::string line; std::getline(lines, line);) {
    auto parsed = nlohmann::json::parse(line, nullptr, false);
    if (!parsed.is_discarded() && parsed.is_object()) j = std::move(parsed);
  }
  if (!j.is_object()) {
    status.missing = proc->exit_code == 127;
    status.error = fmt::format("the peer exited with status {} without a result", proc->exit_code);
    return;
  }
  if (!j.value("ok", false)) {
    status.missing = j.value("missing", false);
    status.error = j.value("error", std::string("the peer reported a failure"));
    return;
  }
  try {
    read(j);
    status.ran = true;
  } catch (const nlohmann::json::exception& e) {
    status.error = fmt::format("unexpected peer output: {}", e.what());
  }
}

}  // namespace actorpipe::bench
