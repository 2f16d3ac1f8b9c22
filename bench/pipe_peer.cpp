// GPipe peer: runs bench/peers/torch_pipe.py in a child process with the thread settings of one
// configuration (bench/peer_process.hpp's environment) and reads back its JSON line.
#include "bench/pipe_peer.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "bench/peer_process.hpp"

namespace actorpipe::bench {

namespace {

PipePeerVariant variant_from_json(const nlohmann::json& j) {
  PipePeerVariant v;
  v.step_ms_all = j.at("step_ms_all").get<std::vector<double>>();
  v.step_ms = j.at("step_ms").get<double>();
  v.tokens_per_s = j.at("tokens_per_s").get<double>();
  v.first_loss = j.at("first_loss").get<double>();
  return v;
}

}  // namespace

std::vector<std::string> pipe_peer_argv(const std::string& python, const std::string& script,
                                        const BenchShape& shape, const OptimizerOptions& opt,
                                        int microbatches, int split, int threads, int reps,
                                        int warmup) {
  return peer_argv(python, script, shape,
                   {"--chunks=" + std::to_string(microbatches), "--split=" + std::to_string(split)},
                   opt, threads, reps, warmup);
}

std::string describe_pipe_peer_command(const std::vector<std::string>& argv, int threads) {
  std::string s;
  for (const auto& [k, v] : peer_environment(threads)) s += k + "=" + v + " ";
  for (size_t i = 0; i < argv.size(); ++i) s += (i ? " " : "") + argv[i];
  return s;
}

PipePeerResult run_pipe_peer(const std::string& python, const std::string& script,
                             const BenchShape& shape, const OptimizerOptions& opt, int microbatches,
                             int split, int threads, int reps, int warmup) {
  PipePeerResult r;
  auto read = [&r](const nlohmann::json& j) {
    r.threads = j.at("threads").get<int>();
    r.torch_version = j.at("torch").get<std::string>();
    r.attention = j.at("attention").get<std::string>();
    r.parameters = j.at("parameters").get<long>();
    r.partitions = j.at("pipe").at("partitions").get<int>();
    r.unsplit = variant_from_json(j.at("unsplit"));
    r.pipe = variant_from_json(j.at("pipe"));
  };
  run_peer(pipe_peer_argv(python, script, shape, opt, microbatches, split, threads, reps, warmup),
           threads, r, read);
  return r;
}

}  // namespace actorpipe::bench
