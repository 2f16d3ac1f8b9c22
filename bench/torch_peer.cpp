// PyTorch peer: runs bench/peers/torch_step.py for one configuration in a child process
// with the thread settings of that configuration and reads back its JSON line.
#include "bench/torch_peer.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace actorpipe::bench {

std::string describe_peer_command(const std::string& python, const std::string& script, int threads,
                                  bool bf16) {
  std::string s;
  for (const auto& [k, v] : peer_environment(threads)) s += k + "=" + v + " ";
  return s + fmt::format("{} {} --threads {}{} (torch.set_num_threads({}))", python, script,
                         threads, bf16 ? " --bf16" : "", threads);
}

PeerResult run_torch_peer(const std::string& python, const std::string& script,
                          const BenchShape& shape, const OptimizerOptions& opt, int threads,
                          int reps, int warmup, bool bf16) {
  PeerResult r;
  auto read = [&r](const nlohmann::json& j) {
    r.torch_version = j.at("torch").get<std::string>();
    r.attention = j.at("attention").get<std::string>();
    r.parameters = j.at("parameters").get<long>();
    r.first_loss = j.at("first_loss").get<double>();
    r.step_ms = j.at("step_ms").get<double>();
    r.tokens_per_s = j.at("tokens_per_s").get<double>();
    r.peak_rss_mb = j.at("peak_rss_mb").get<double>();
    r.import_rss_mb = j.at("import_rss_mb").get<double>();
  };
  const std::vector<std::string> extra =
      bf16 ? std::vector<std::string>{"--bf16"} : std::vector<std::string>{};
  run_peer(peer_argv(python, script, shape, extra, opt, threads, reps, warmup), threads, r, read);
  return r;
}

}  // namespace actorpipe::bench
