// Rank jobs: the benchmark's own program started as the ranks of a local job, and each rank's
// ProcessGroup, joined from the environment that job gives it.
#include "bench/rank_job.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

#include "bench/subprocess.hpp"
#include "examples/launch/launcher.hpp"
#include "transport/cluster_env.hpp"

extern char** environ;

namespace actorpipe::bench {

Expected<RankJobResult> run_rank_job(const std::vector<std::string>& args, int world,
                                     const std::vector<std::pair<std::string, std::string>>& env,
                                     double grace_seconds) {
  LaunchOptions options;
  options.processes = world;
  options.grace_seconds = grace_seconds;
  // ACTORPIPE_BENCH_CPU_BIND=none|cores|auto: actorpipe-launch's --cpu-bind (default auto), to
  // compare
  if (const char* v = std::getenv("ACTORPIPE_BENCH_CPU_BIND"); v != nullptr) {
    auto bind = parse_cpu_bind(v);
    if (!bind) return make_error("ACTORPIPE_BENCH_CPU_BIND: {}", bind.error().message);
    options.cpu_bind = *bind;
  }
  const std::string self = self_executable();
  options.command.push_back(self);
  options.command.insert(options.command.end(), args.begin(), args.end());
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) vars[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [k, v] : env) vars[k] = v;
  std::vector<std::string> base;
  for (const auto& [k, v] : vars) base.push_back(k + "=" + v);
  auto plan = plan_launch(options, self, base);
  if (!plan) return plan.error();

  RankJobResult result;
  result.out.resize(static_cast<size_t>(world));
  LaunchIo io = launch_io_to(STDOUT_FILENO, STDERR_FILENO);
  LaunchIo collecting = io;
  collecting.line = [&](int rank, OutputStream stream, std::string_view line) {
    if (stream == OutputStream::out)
      result.out[static_cast<size_t>(rank)].emplace_back(line);
    else
      io.line(rank, stream, line);
  };
  const LaunchResult launched = run_launch(*plan, collecting);
  if (launched.failed_rank >= 0)
    result.failure = describe_outcome(launched.ranks[static_cast<size_t>(launched.failed_rank)]);
  return result;
}

Expected<std::unique_ptr<ProcessGroup>> join_rank_job(const ProcessGroupOptions& base) {
  auto cluster = resolve_cluster_env({}, process_environment());
  if (!cluster) return cluster.error();
  if (!cluster->multi_process())
    return make_error("not started as a rank of a job (no ACTORPIPE_RANK/ACTORPIPE_WORLD)");
  auto secret = load_job_secret(*cluster, process_environment());
  if (!secret) return secret.error();
  ProcessGroupOptions o = base;
  // ACTORPIPE_BENCH_CALLER_PROGRESS=0: every UCX call through the progress thread, to compare
  if (const char* v = std::getenv("ACTORPIPE_BENCH_CALLER_PROGRESS"); v != nullptr)
    o.ucx.caller_progress = std::string_view(v) != "0";
  o.rank = cluster->rank;
  o.world = cluster->world;
  o.coordinator_host = cluster->coordinator_host;
  o.coordinator_port = cluster->coordinator_port;
  o.secret = *secret;
  return ProcessGroup::create(o);
}

Expected<std::string> find_json_line(const std::vector<std::string>& lines, const std::string& name,
                                     const std::string& what) {
  for (const std::string& line : lines) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.value("name", "") == name) return line;
  }
  std::string shown;
  for (const std::string& line : lines) shown += "\n  " + line.substr(0, 200);
  return make_error("{}: no '{}' line in its output{}", what, name,
                    lines.empty() ? std::string(" (it printed nothing)") : shown);
}

Status rank_barrier(ProcessGroup& g) {
  auto r = g.all_gather({});
  if (!r) return r.error();
  return {};
}

bool have_ucx_perftest() {
  const char* path = std::getenv("PATH");
  return resolve_program("ucx_perftest", path != nullptr ? path : "").ok();
}

}  // namespace actorpipe::bench
