// PyTorch peer: runs bench/peers/torch_step.py for one configuration in a child process
// with the thread settings of that configuration and reads back its JSON line.
#include "bench/torch_peer.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/subprocess.hpp"

namespace actorpipe::bench {

std::vector<std::pair<std::string, std::string>> peer_environment(int threads) {
  const std::string t = std::to_string(threads);
  std::vector<std::pair<std::string, std::string>> env = {{"OMP_NUM_THREADS", t},
                                                          {"OPENBLAS_NUM_THREADS", t}};
  if (threads >= 2) {
    env.emplace_back("OMP_WAIT_POLICY", "PASSIVE");
    env.emplace_back("OPENBLAS_THREAD_TIMEOUT", "4");
  }
  return env;
}

std::string describe_peer_command(const std::string& python, const std::string& script,
                                  int threads) {
  std::string s;
  for (const auto& [k, v] : peer_environment(threads)) s += k + "=" + v + " ";
  return s + fmt::format("{} {} --threads {} (torch.set_num_threads({}))", python, script, threads,
                         threads);
}

PeerResult run_torch_peer(const std::string& python, const std::string& script,
                          const BenchShape& shape, const OptimizerOptions& opt, int threads,
                          int reps, int warmup) {
  PeerResult r;
  if (access(script.c_str(), R_OK) != 0) {
    r.missing = true;
    r.error = fmt::format("peer script {} not found (use --peer-script)", script);
    return r;
  }
  const ModelOptions& m = shape.model;
  const std::vector<std::string> argv = {
      python,
      script,
      "--vocab=" + std::to_string(m.vocab_size),
      "--context=" + std::to_string(m.context),
      "--width=" + std::to_string(m.width),
      "--depth=" + std::to_string(m.depth),
      "--heads=" + std::to_string(m.heads),
      "--batch=" + std::to_string(shape.B),
      "--seq=" + std::to_string(shape.T),
      "--threads=" + std::to_string(threads),
      "--reps=" + std::to_string(reps),
      "--warmup=" + std::to_string(warmup),
      fmt::format("--lr={}", opt.lr),
      fmt::format("--beta1={}", opt.beta1),
      fmt::format("--beta2={}", opt.beta2),
      fmt::format("--eps={}", opt.eps),
      fmt::format("--weight-decay={}", opt.weight_decay),
      fmt::format("--grad-clip={}", opt.grad_clip),
  };
  auto proc = run_process(argv, peer_environment(threads));
  if (!proc) {
    r.missing = true;
    r.error = proc.error().message;
    return r;
  }
  // The last line that parses as JSON is the peer's answer.
  nlohmann::json j;
  std::istringstream lines(proc->out);
  for (std::string line; std::getline(lines, line);) {
    auto parsed = nlohmann::json::parse(line, nullptr, false);
    if (!parsed.is_discarded() && parsed.is_object()) j = std::move(parsed);
  }
  if (!j.is_object()) {
    r.missing = proc->exit_code == 127;
    r.error = fmt::format("the peer exited with status {} without a result", proc->exit_code);
    return r;
  }
  if (!j.value("ok", false)) {
    r.missing = j.value("missing", false);
    r.error = j.value("error", std::string("the peer reported a failure"));
    return r;
  }
  try {
    r.torch_version = j.at("torch").get<std::string>();
    r.attention = j.at("attention").get<std::string>();
    r.parameters = j.at("parameters").get<long>();
    r.first_loss = j.at("first_loss").get<double>();
    r.step_ms = j.at("step_ms").get<double>();
    r.tokens_per_s = j.at("tokens_per_s").get<double>();
    r.peak_rss_mb = j.at("peak_rss_mb").get<double>();
    r.import_rss_mb = j.at("import_rss_mb").get<double>();
    r.ran = true;
  } catch (const nlohmann::json::exception& e) {
    r.error = fmt::format("unexpected peer output: {}", e.what());
  }
  return r;
}

}  // namespace actorpipe::bench
