// GPipe peer: runs bench/peers/torch_pipe.py in a child process with the thread settings of one
// configuration (bench/torch_peer.hpp's environment) and reads back its JSON line.
#include "bench/pipe_peer.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/subprocess.hpp"
#include "bench/torch_peer.hpp"

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
  const ModelOptions& m = shape.model;
  return {python,
          script,
          "--vocab=" + std::to_string(m.vocab_size),
          "--context=" + std::to_string(m.context),
          "--width=" + std::to_string(m.width),
          "--depth=" + std::to_string(m.depth),
          "--heads=" + std::to_string(m.heads),
          "--batch=" + std::to_string(shape.B),
          "--seq=" + std::to_string(shape.T),
          "--chunks=" + std::to_string(microbatches),
          "--split=" + std::to_string(split),
          "--threads=" + std::to_string(threads),
          "--reps=" + std::to_string(reps),
          "--warmup=" + std::to_string(warmup),
          fmt::format("--lr={}", opt.lr),
          fmt::format("--beta1={}", opt.beta1),
          fmt::format("--beta2={}", opt.beta2),
          fmt::format("--eps={}", opt.eps),
          fmt::format("--weight-decay={}", opt.weight_decay),
          fmt::format("--grad-clip={}", opt.grad_clip)};
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
  if (access(script.c_str(), R_OK) != 0) {
    r.missing = true;
    r.error = fmt::format("peer script {} not found (use --peer-script)", script);
    return r;
  }
  auto proc = run_process(
      pipe_peer_argv(python, script, shape, opt, microbatches, split, threads, reps, warmup),
      peer_environment(threads));
  if (!proc) {
    r.missing = true;
    r.error = proc.error().message;
    return r;
  }
  // the last line that parses as a JSON object is the peer's answer
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
    r.threads = j.at("threads").get<int>();
    r.torch_version = j.at("torch").get<std::string>();
    r.attention = j.at("attention").get<std::string>();
    r.parameters = j.at("parameters").get<long>();
    r.partitions = j.at("pipe").at("partitions").get<int>();
    r.unsplit = variant_from_json(j.at("unsplit"));
    r.pipe = variant_from_json(j.at("pipe"));
    r.ran = true;
  } catch (const nlohmann::json::exception& e) {
    r.error = fmt::format("unexpected peer output: {}", e.what());
  }
  return r;
}

}  // namespace actorpipe::bench
