// Tests of actorpipe-launch's process management with small shell commands as ranks: prefixes,
// each rank's environment, stopping the job when one rank fails, signals in and out.
#include "examples/launch/launcher.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "tests/support/temp_dir.hpp"
#include "transport/cluster_env.hpp"

extern char** environ;

using namespace actorpipe;

namespace {

using Clock = std::chrono::steady_clock;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<std::string> own_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

std::string sh_path() {
  const char* path = std::getenv("PATH");
  auto sh = resolve_program("sh", path != nullptr ? path : "");
  REQUIRE(sh.ok());
  return *sh;
}

// What a job wrote: every line with its rank and stream, and the launcher's messages.
struct Captured {
  std::vector<std::tuple<int, OutputStream, std::string>> lines;
  std::vector<std::string> messages;

  std::vector<std::string> of(int rank, OutputStream stream) const {
    std::vector<std::string> out;
    for (const auto& [r, s, line] : lines) {
      if (r == rank && s == stream) out.push_back(line);
    }
    return out;
  }
};

struct Job {
  int processes = 1;
  double grace = 10;
  std::vector<std::string> base_env = own_environment();
  int interrupt_fd = -1;
  CpuBind cpu_bind = CpuBind::automatic;
  // called after each captured line (the test's chance to act on a rank's output)
  std::function<void(const Captured&)> after_line;
};

LaunchResult run_sh(const std::string& script, const Job& job, Captured& captured,
                    LaunchPlan* plan_out = nullptr) {
  LaunchOptions options;
  options.processes = job.processes;
  options.grace_seconds = job.grace;
  options.cpu_bind = job.cpu_bind;
  options.command = {"sh", "-c", script};
  auto plan = plan_launch(options, sh_path(), job.base_env);
  REQUIRE(plan.ok());
  if (plan_out != nullptr) *plan_out = *plan;
  LaunchIo io;
  io.line = [&](int rank, OutputStream stream, std::string_view line) {
    captured.lines.emplace_back(rank, stream, std::string(line));
    if (job.after_line) job.after_line(captured);
  };
  io.message = [&](std::string_view m) { captured.messages.emplace_back(m); };
  io.interrupt_fd = job.interrupt_fd;
  return run_launch(*plan, io);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool is_hex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (const char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("arguments: -n, --port, --bind, --grace, then the command") {
  auto a = parse_launch_args(
      {"-n", "3", "--port", "29400", "--bind", "::1", "--grace=2.5", "--", "prog", "--rank", "x"});
  REQUIRE(a.ok());
  CHECK(a->processes == 3);
  CHECK(a->port == 29400);
  CHECK(a->bind == "::1");
  CHECK(a->grace_seconds == 2.5);
  CHECK(a->command == std::vector<std::string>{"prog", "--rank", "x"});

  // without "--" the first argument that is no option starts the command
  auto b = parse_launch_args({"-n", "1", "prog", "-n", "5"});
  REQUIRE(b.ok());
  CHECK(b->processes == 1);
  CHECK(b->port == 0);
  CHECK(b->bind == "127.0.0.1");
  CHECK(b->grace_seconds == 10);
  CHECK(b->command == std::vector<std::string>{"prog", "-n", "5"});

  auto h = parse_launch_args({"--help"});
  REQUIRE(h.ok());
  CHECK(h->help);
}

TEST_CASE("bad arguments: one line naming the argument, its value and what is allowed") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"-n", "0", "--", "p"}, "-n: '0' is not allowed: expected an integer from 1 to 1024"},
      {{"-n", "x", "--", "p"}, "-n: 'x' is not allowed: expected an integer from 1 to 1024"},
      {{"-n", "1025", "p"}, "-n: '1025' is not allowed"},
      {{"-n", "2", "--port", "0", "p"},
       "--port: '0' is not allowed: expected an integer from 1 to 65535"},
      {{"-n", "2", "--port", "70000", "p"}, "--port: '70000' is not allowed"},
      {{"-n", "2", "--bind", "localhost", "p"},
       "--bind: 'localhost' is not allowed: expected a numeric IPv4 or IPv6 address"},
      {{"-n", "2", "--grace", "-1", "p"},
       "--grace: '-1' is not allowed: expected seconds from 0 to 3600"},
      {{"-n", "2", "--grace", "soon", "p"}, "--grace: 'soon' is not allowed"},
      {{"-n", "2", "--verbose", "p"},
       "unknown argument '--verbose'; allowed: -n N, --port P, --bind ADDR, --grace S, "
       "--max-restarts K, --relaunch dead|all, --restart-backoff S, --cpu-bind auto|cores|none, "
       "--help"},
      {{"-n", "2", "--relaunch", "some", "p"},
       "--relaunch: 'some' is not allowed: expected dead or all"},
      {{"-n"}, "-n needs a value (see --help)"},
      {{"--", "prog"}, "-n is missing: expected the number of processes"},
      {{"-n", "2"}, "no program given: expected actorpipe-launch -n N [options] -- PROGRAM"},
      {{"-n", "2", "--"}, "no program given"},
  };
  for (const auto& [args, expected] : cases) {
    CAPTURE(expected);
    auto r = parse_launch_args(args);
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().message, expected));
    CHECK_FALSE(contains(r.error().message, "\n"));
  }
}

TEST_CASE("--hosts is refused: actorpipe-launch starts local processes only") {
  for (const char* flag : {"--hosts", "-H", "--hostfile"}) {
    CAPTURE(std::string(flag));
    auto r = parse_launch_args({"-n", "2", flag, "a,b", "--", "prog"});
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().message, "actorpipe-launch starts local processes only"));
    CHECK(contains(r.error().message, "mpirun, srun or torchrun"));
  }
  CHECK_FALSE(parse_launch_args({"-n", "2", "--hosts=a,b", "prog"}).ok());
}

TEST_CASE("a rank's environment replaces the job variables it inherits") {
  const std::vector<std::string> base = {"PATH=/bin",
                                         "ACTORPIPE_RANK=7",
                                         "ACTORPIPE_WORLD=9",
                                         "ACTORPIPE_COORDINATOR=old:1",
                                         "ACTORPIPE_JOB_SECRET=old",
                                         "ACTORPIPE_JOB_SECRET_FILE=/old",
                                         "ACTORPIPE_RANKS_OTHER=kept",
                                         "HOME=/root"};
  const auto env = rank_environment(base, 2, 4, "127.0.0.1:5000", "s3cr3t");
  CHECK(env == std::vector<std::string>{"PATH=/bin", "ACTORPIPE_RANKS_OTHER=kept", "HOME=/root",
                                        "ACTORPIPE_RANK=2", "ACTORPIPE_WORLD=4",
                                        "ACTORPIPE_COORDINATOR=127.0.0.1:5000",
                                        "ACTORPIPE_JOB_SECRET=s3cr3t"});
}

TEST_CASE("the plan holds the coordinator's port, and a --port in use is refused naming it") {
  LaunchOptions options;
  options.processes = 2;
  options.bind = "127.0.0.1";
  options.command = {"sh", "-c", "true"};
  auto plan = plan_launch(options, sh_path(), own_environment());
  REQUIRE(plan.ok());
  REQUIRE(plan->port != nullptr);
  const int port = plan->port->port();
  CHECK(plan->coordinator == fmt::format("127.0.0.1:{}", port));

  // held: no plain bind gets it
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  CHECK(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0);
  ::close(fd);

  // a port another program listens on
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(listener >= 0);
  addr.sin_port = 0;
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(listener, 1) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  options.port = ntohs(addr.sin_port);
  auto busy = plan_launch(options, sh_path(), own_environment());
  ::close(listener);
  REQUIRE_FALSE(busy.ok());
  CHECK(contains(busy.error().message, fmt::format("--port: {} is not available", options.port)));

  options.port = port;
  plan = Error{"dropped"};  // the last copy of the plan: the port is free again
  auto after = plan_launch(options, sh_path(), own_environment());
  REQUIRE(after.ok());
  CHECK(after->port->port() == port);
}

TEST_CASE("a fresh secret per call") {
  auto s1 = make_job_secret();
  auto s2 = make_job_secret();
  REQUIRE(s1.ok());
  REQUIRE(s2.ok());
  CHECK(is_hex64(*s1));
  CHECK(is_hex64(*s2));
  CHECK(*s1 != *s2);
}

TEST_CASE("resolve_program looks in PATH and refuses what cannot run") {
  testing::TempDir dir;
  const std::string tool = dir.file("tool");
  std::ofstream(tool) << "#!/bin/sh\n";
  REQUIRE(::chmod(tool.c_str(), 0700) == 0);
  const std::string data = dir.file("data");
  std::ofstream(data) << "x\n";

  auto found = resolve_program("tool", "/nonexistent:" + dir.str());
  REQUIRE(found.ok());
  CHECK(*found == tool);
  CHECK(resolve_program(tool, "").value() == tool);
  CHECK(contains(resolve_program("data", dir.str()).error().message,
                 "PROGRAM: 'data' is not found in PATH"));
  CHECK(contains(resolve_program(data, "").error().message,
                 "is not allowed: it is not an executable file"));
  CHECK(contains(resolve_program(dir.file("none"), "").error().message, "no such file"));
}

TEST_CASE("every line of stdout and stderr carries its rank, a last partial line too") {
  Captured c;
  Job job;
  job.processes = 2;
  auto r = run_sh("echo a; echo b >&2; echo c; printf partial", job, c);
  CHECK(r.exit_code == 0);
  CHECK(r.failed_rank == -1);
  CHECK(c.messages.empty());
  for (int k = 0; k < 2; ++k) {
    CHECK(c.of(k, OutputStream::out) == std::vector<std::string>{"a", "c", "partial"});
    CHECK(c.of(k, OutputStream::err) == std::vector<std::string>{"b"});
  }
  REQUIRE(r.ranks.size() == 2);
  for (const RankOutcome& o : r.ranks) {
    CHECK(o.started);
    CHECK(o.exited);
    CHECK(o.status == 0);
  }
  CHECK(prefixed_line(3, "hello") == "[rank 3] hello\n");
}

TEST_CASE("each rank sees its rank, the world, the coordinator and the job's one secret") {
  Job job;
  job.processes = 3;
  job.base_env.push_back("ACTORPIPE_JOB_SECRET_FILE=/inherited");  // must not reach the ranks
  job.base_env.push_back("ACTORPIPE_RANK=9");
  const std::string script =
      "env | grep -E '^ACTORPIPE_(RANK|WORLD|COORDINATOR|JOB_SECRET|JOB_SECRET_FILE)=' | sort";

  Captured c1;
  LaunchPlan plan1;
  REQUIRE(run_sh(script, job, c1, &plan1).exit_code == 0);
  CHECK(contains(plan1.coordinator, "127.0.0.1:"));
  std::set<std::string> secrets;
  for (int k = 0; k < 3; ++k) {
    std::map<std::string, std::string> vars;
    for (const std::string& line : c1.of(k, OutputStream::out)) {
      vars[line.substr(0, line.find('='))] = line.substr(line.find('=') + 1);
    }
    CHECK(vars.size() == 4);
    CHECK(vars["ACTORPIPE_RANK"] == std::to_string(k));
    CHECK(vars["ACTORPIPE_WORLD"] == "3");
    CHECK(vars["ACTORPIPE_COORDINATOR"] == plan1.coordinator);
    CHECK(is_hex64(vars["ACTORPIPE_JOB_SECRET"]));
    CHECK(vars.count("ACTORPIPE_JOB_SECRET_FILE") == 0);
    secrets.insert(vars["ACTORPIPE_JOB_SECRET"]);

    // what the rank sees is what the cluster environment accepts
    auto cluster = resolve_cluster_env({}, environment_from(vars));
    REQUIRE(cluster.ok());
    CHECK(cluster->rank == k);
    CHECK(cluster->world == 3);
    CHECK(cluster->source == ClusterSource::actorpipe_launch);
    CHECK(cluster->coordinator() == plan1.coordinator);
    auto secret = load_job_secret(*cluster, environment_from(vars));
    REQUIRE(secret.ok());
    CHECK(*secret == plan1.secret);
  }
  CHECK(secrets.size() == 1);  // one secret for the whole job

  Captured c2;
  LaunchPlan plan2;
  REQUIRE(run_sh(script, job, c2, &plan2).exit_code == 0);
  CHECK(is_hex64(plan2.secret));
  CHECK(plan2.secret != plan1.secret);  // and a new one for the next job
}

TEST_CASE("--cpu-bind: auto by default, cores, none, anything else refused") {
  auto a = parse_launch_args({"-n", "2", "prog"});
  REQUIRE(a.ok());
  CHECK(a->cpu_bind == CpuBind::automatic);
  auto c = parse_launch_args({"-n", "2", "--cpu-bind", "cores", "prog"});
  REQUIRE(c.ok());
  CHECK(c->cpu_bind == CpuBind::cores);
  auto n = parse_launch_args({"-n", "2", "--cpu-bind=none", "prog"});
  REQUIRE(n.ok());
  CHECK(n->cpu_bind == CpuBind::none);
  auto bad = parse_launch_args({"-n", "2", "--cpu-bind", "socket", "prog"});
  REQUIRE(!bad.ok());
  CHECK(bad.error().message == "--cpu-bind: 'socket' is not allowed: expected auto, cores or none");
}

TEST_CASE("CPU binding: equal shares in order, none, auto with too few CPUs, cores refused") {
  using Lists = std::vector<std::vector<int>>;
  const std::vector<int> eight = {0, 1, 2, 3, 4, 5, 6, 7};
  auto three = plan_cpu_binding(CpuBind::cores, 3, eight);
  REQUIRE(three.ok());
  CHECK(*three == Lists{{0, 1}, {2, 3, 4}, {5, 6, 7}});
  // the launcher's own CPUs, whatever their numbers
  auto sparse = plan_cpu_binding(CpuBind::automatic, 2, {2, 5, 7, 9});
  REQUIRE(sparse.ok());
  CHECK(*sparse == Lists{{2, 5}, {7, 9}});
  auto one_each = plan_cpu_binding(CpuBind::automatic, 2, {0, 1});
  REQUIRE(one_each.ok());
  CHECK(*one_each == Lists{{0}, {1}});
  auto none = plan_cpu_binding(CpuBind::none, 2, eight);
  REQUIRE(none.ok());
  CHECK(*none == Lists{{}, {}});
  auto too_many = plan_cpu_binding(CpuBind::automatic, 3, {0, 1});
  REQUIRE(too_many.ok());
  CHECK(*too_many == Lists{{}, {}, {}});
  auto refused = plan_cpu_binding(CpuBind::cores, 3, {0, 1});
  REQUIRE(!refused.ok());
  CHECK(refused.error().message ==
        "--cpu-bind cores: 3 ranks need at least 3 CPUs, and this launcher may run on 2 (0-1); "
        "use --cpu-bind none or fewer ranks");

  CHECK(cpu_list_text({}).empty());
  CHECK(cpu_list_text({5}) == "5");
  CHECK(cpu_list_text({0, 1, 2, 3, 6, 8, 9}) == "0-3,6,8-9");
}

TEST_CASE("bound ranks run on their own CPUs, unbound ones on the launcher's") {
  const std::vector<int> mine = allowed_cpus();
  REQUIRE(!mine.empty());
  const std::string script = "grep '^Cpus_allowed_list:' /proc/self/status | cut -f2";
  Job job;
  job.processes = static_cast<int>(std::min<std::size_t>(mine.size(), 2));
  job.cpu_bind = CpuBind::cores;
  Captured bound;
  LaunchPlan plan;
  REQUIRE(run_sh(script, job, bound, &plan).exit_code == 0);
  REQUIRE(plan.cpus.size() == static_cast<std::size_t>(job.processes));
  std::vector<int> covered;
  for (int k = 0; k < job.processes; ++k) {
    const auto& cpus = plan.cpus[static_cast<std::size_t>(k)];
    CHECK(!cpus.empty());
    covered.insert(covered.end(), cpus.begin(), cpus.end());
    CHECK(bound.of(k, OutputStream::out) == std::vector<std::string>{cpu_list_text(cpus)});
  }
  CHECK(covered == mine);  // disjoint shares that cover the launcher's CPUs, in order

  job.cpu_bind = CpuBind::none;
  Captured unbound;
  REQUIRE(run_sh(script, job, unbound).exit_code == 0);
  for (int k = 0; k < job.processes; ++k)
    CHECK(unbound.of(k, OutputStream::out) == std::vector<std::string>{cpu_list_text(mine)});
}

TEST_CASE("a rank that cannot be bound is not started: exit code 127 and the CPUs named") {
  LaunchOptions options;
  options.processes = 1;
  options.cpu_bind = CpuBind::none;
  options.command = {"sh", "-c", "echo started"};
  auto plan = plan_launch(options, sh_path(), own_environment());
  REQUIRE(plan.ok());
  plan->cpus = {{4095}};  // a CPU no machine here has
  Captured c;
  LaunchIo io;
  io.line = [&](int rank, OutputStream stream, std::string_view line) {
    c.lines.emplace_back(rank, stream, std::string(line));
  };
  io.message = [&](std::string_view m) { c.messages.emplace_back(m); };
  const LaunchResult r = run_launch(*plan, io);
  CHECK(r.exit_code == 127);
  CHECK(r.failed_rank == 0);
  CHECK(c.of(0, OutputStream::out).empty());
  REQUIRE(c.messages.size() == 1);
  CHECK(contains(c.messages[0], "cannot start rank 0: cannot bind it to CPUs 4095: "));
}

TEST_CASE("a rank that exits 5 stops its siblings within the grace period") {
  Captured c;
  Job job;
  job.processes = 3;
  job.grace = 10;
  const auto t0 = Clock::now();
  auto r =
      run_sh("if [ \"$ACTORPIPE_RANK\" = 1 ]; then sleep 0.2; exit 5; fi; exec sleep 30", job, c);
  const double took = seconds_since(t0);
  CHECK(took < 5.0);  // SIGTERM ended the sleeps; no SIGKILL was needed
  CHECK(r.exit_code == 5);
  CHECK(r.failed_rank == 1);
  REQUIRE(c.messages.size() == 1);
  CHECK(c.messages[0] == "rank 1 exited with status 5; stopping ranks 0, 2");
  REQUIRE(r.ranks.size() == 3);
  CHECK(describe_outcome(r.ranks[1]) == "rank 1 exited with status 5");
  for (const int k : {0, 2}) {
    CHECK_FALSE(r.ranks[static_cast<std::size_t>(k)].exited);
    CHECK(r.ranks[static_cast<std::size_t>(k)].signal == SIGTERM);
  }
}

TEST_CASE("a sibling that ignores SIGTERM gets SIGKILL when the grace period is over") {
  testing::TempDir dir;
  Captured c;
  Job job;
  job.processes = 2;
  job.grace = 0.3;
  // rank 0 ignores SIGTERM, then says so in a file; rank 1 waits for the file (at most 10 s)
  const std::string ready = dir.file("ready");
  const std::string script = "if [ \"$ACTORPIPE_RANK\" = 0 ]; then trap '' TERM; touch '" + ready +
                             "'; exec sleep 30; fi; i=0; while [ ! -e '" + ready +
                             "' ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; exit 4";
  const auto t0 = Clock::now();
  auto r = run_sh(script, job, c);
  const double took = seconds_since(t0);
  CHECK(took >= 0.3);
  CHECK(took < 5.0);
  CHECK(r.exit_code == 4);
  CHECK(r.failed_rank == 1);
  REQUIRE(c.messages.size() == 2);
  CHECK(c.messages[0] == "rank 1 exited with status 4; stopping rank 0");
  CHECK(c.messages[1] == "rank 0 still running 0.3 s after SIGTERM; sending SIGKILL");
  CHECK(r.ranks[0].signal == SIGKILL);
}

TEST_CASE("a rank killed by a signal is reported by the signal's name") {
  SUBCASE("SIGKILL") {
    Captured c;
    auto r = run_sh("kill -KILL $$", Job{}, c);
    CHECK(r.exit_code == 128 + 9);
    CHECK(r.failed_rank == 0);
    REQUIRE(c.messages.size() == 1);
    CHECK(c.messages[0] == "rank 0 killed by signal 9 (SIGKILL)");
  }
  SUBCASE("SIGUSR1, with a sibling to stop") {
    Captured c;
    Job job;
    job.processes = 2;
    auto r =
        run_sh("if [ \"$ACTORPIPE_RANK\" = 0 ]; then exec sleep 30; fi; kill -USR1 $$", job, c);
    CHECK(r.exit_code == 128 + SIGUSR1);
    CHECK(r.failed_rank == 1);
    REQUIRE(c.messages.size() == 1);
    CHECK(c.messages[0] ==
          fmt::format("rank 1 killed by signal {} (SIGUSR1); stopping rank 0", SIGUSR1));
  }
  CHECK(signal_name(SIGTERM) == "SIGTERM");
  CHECK(signal_name(SIGINT) == "SIGINT");
  CHECK(signal_name(77) == "signal 77");  // no name above SIGRTMAX
}

TEST_CASE("a signal the launcher receives reaches every rank") {
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  Job job;
  job.processes = 2;
  job.grace = 10;
  job.interrupt_fd = pipe_fds[0];
  int sent = 0;
  // once every rank is ready, "receive" the signal: its number on the interrupt pipe
  auto send_when_ready = [&](int sig) {
    return [&, sig](const Captured& c) {
      int ready = 0;
      for (const auto& [rank, stream, line] : c.lines) ready += line == "ready" ? 1 : 0;
      if (ready == job.processes && sent == 0) {
        const unsigned char byte = static_cast<unsigned char>(sig);
        REQUIRE(::write(pipe_fds[1], &byte, 1) == 1);
        ++sent;
      }
    };
  };

  SUBCASE("ranks that catch SIGTERM and exit 0: the launcher exits 0") {
    Captured c;
    job.after_line = send_when_ready(SIGTERM);
    auto r = run_sh(
        "trap 'echo got TERM; exit 0' TERM; echo ready; i=0; while [ $i -lt 300 ]; do sleep 0.1; "
        "i=$((i+1)); done; exit 5",
        job, c);
    CHECK(sent == 1);
    CHECK(r.exit_code == 0);
    for (int k = 0; k < 2; ++k) {
      CHECK(c.of(k, OutputStream::out) == std::vector<std::string>{"ready", "got TERM"});
    }
    REQUIRE(c.messages.size() == 1);
    CHECK(c.messages[0] == "received SIGTERM; forwarding it to ranks 0, 1");
  }
  SUBCASE("ranks that SIGINT ends: the first one's 128 + 2") {
    Captured c;
    job.after_line = send_when_ready(SIGINT);
    const auto t0 = Clock::now();
    auto r = run_sh("echo ready; exec sleep 30", job, c);
    CHECK(seconds_since(t0) < 5.0);
    CHECK(sent == 1);
    CHECK(r.exit_code == 128 + SIGINT);
    REQUIRE(c.messages.size() == 2);
    CHECK(c.messages[0] == "received SIGINT; forwarding it to ranks 0, 1");
    CHECK(contains(c.messages[1], "killed by signal 2 (SIGINT)"));
    for (const RankOutcome& o : r.ranks) CHECK(o.signal == SIGINT);
  }
  SUBCASE("the first signal waits for a graceful stop longer than the grace period") {
    Captured c;
    job.grace = 0.3;
    job.after_line = send_when_ready(SIGTERM);
    const auto t0 = Clock::now();
    auto r = run_sh(
        "trap 'echo got TERM; sleep 1.5; echo saved; exit 143' TERM; echo ready; i=0; "
        "while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; exit 5",
        job, c);
    CHECK(seconds_since(t0) >= 1.5);
    CHECK(r.exit_code == 143);
    for (int k = 0; k < 2; ++k) {
      CHECK(c.of(k, OutputStream::out) == std::vector<std::string>{"ready", "got TERM", "saved"});
      CHECK(r.ranks[static_cast<size_t>(k)].exited);
    }
    for (const std::string& m : c.messages) CHECK_FALSE(contains(m, "SIGKILL"));
  }
  SUBCASE("a second signal: SIGKILL after the grace period") {
    Captured c;
    job.grace = 0.3;
    // both signals once the ranks are ready; the ranks go on after each
    job.after_line = [&](const Captured& got) {
      int ready = 0;
      for (const auto& [rank, stream, line] : got.lines) ready += line == "ready" ? 1 : 0;
      if (ready == job.processes && sent == 0) {
        const unsigned char bytes[2] = {SIGTERM, SIGTERM};
        REQUIRE(::write(pipe_fds[1], bytes, 2) == 2);
        sent = 2;
      }
    };
    const auto t0 = Clock::now();
    auto r = run_sh(
        "trap 'echo got TERM' TERM; echo ready; i=0; while [ $i -lt 300 ]; do sleep 0.1; "
        "i=$((i+1)); done; exit 5",
        job, c);
    CHECK(seconds_since(t0) < 10.0);
    CHECK(r.exit_code == 128 + SIGKILL);
    REQUIRE(c.messages.size() >= 3);
    CHECK(c.messages[0] == "received SIGTERM; forwarding it to ranks 0, 1");
    CHECK(c.messages[1] == "received SIGTERM; forwarding it to ranks 0, 1");
    CHECK(contains(c.messages[2], "sending SIGKILL"));
  }
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

TEST_CASE("a program that cannot start: exit code 127 and the reason") {
  testing::TempDir dir;
  const std::string bad = dir.file("not-a-program");
  std::ofstream(bad) << "no interpreter line, no ELF header\n";
  REQUIRE(::chmod(bad.c_str(), 0700) == 0);
  LaunchOptions options;
  options.processes = 2;
  options.command = {bad};
  auto plan = plan_launch(options, bad, own_environment());
  REQUIRE(plan.ok());
  Captured c;
  LaunchIo io;
  io.line = [&](int rank, OutputStream s, std::string_view l) {
    c.lines.emplace_back(rank, s, std::string(l));
  };
  io.message = [&](std::string_view m) { c.messages.emplace_back(m); };
  auto r = run_launch(*plan, io);
  CHECK(r.exit_code == 127);
  CHECK(r.failed_rank == 0);
  REQUIRE(c.messages.size() == 1);
  CHECK(c.messages[0] == "cannot start rank 0: " + bad + ": Exec format error");
  CHECK_FALSE(r.ranks[0].started);
  CHECK_FALSE(r.ranks[1].started);
  CHECK(describe_outcome(r.ranks[1]) == "rank 1 was not started");
}

TEST_CASE("written to descriptors, lines never mix, and a line longer than 64 KiB is cut") {
  testing::TempDir dir;
  const std::string file = dir.file("out");
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  LaunchOptions options;
  options.processes = 4;
  const std::string payload(80, 'x');
  options.command = {"sh", "-c",
                     "i=0; while [ $i -lt 300 ]; do echo \"out-$ACTORPIPE_RANK-$i-" + payload +
                         "\"; echo \"err-$ACTORPIPE_RANK-$i-" + payload +
                         "\" >&2; i=$((i+1)); done; "
                         "if [ \"$ACTORPIPE_RANK\" = 0 ]; then head -c 100000 /dev/zero | "
                         "tr '\\0' y; fi"};
  auto plan = plan_launch(options, sh_path(), own_environment());
  REQUIRE(plan.ok());
  auto r = run_launch(*plan, launch_io_to(fd, fd));
  ::close(fd);
  CHECK(r.exit_code == 0);

  std::ifstream in(file);
  std::string line;
  std::map<std::string, int> count;  // "out-2" -> lines seen
  std::vector<std::size_t> long_lines;
  while (std::getline(in, line)) {
    CAPTURE(line.substr(0, 120));
    REQUIRE(line.rfind("[rank ", 0) == 0);
    const std::size_t close = line.find("] ");
    REQUIRE(close != std::string::npos);
    const std::string rank = line.substr(6, close - 6);
    const std::string text = line.substr(close + 2);
    if (text.find_first_not_of('y') == std::string::npos) {
      CHECK(rank == "0");
      long_lines.push_back(text.size());
      continue;
    }
    // "<stream>-<rank>-<i>-xxxx...": whole, and from the rank its prefix names
    const std::string stream = text.substr(0, 3);
    REQUIRE((stream == "out" || stream == "err"));
    CHECK(text.substr(4, rank.size() + 1) == rank + "-");
    CHECK(text.size() > payload.size());
    CHECK(text.substr(text.size() - payload.size()) == payload);
    ++count[stream + "-" + rank];
  }
  for (int k = 0; k < 4; ++k) {
    CHECK(count["out-" + std::to_string(k)] == 300);
    CHECK(count["err-" + std::to_string(k)] == 300);
  }
  CHECK(long_lines == std::vector<std::size_t>{65536, 100000 - 65536});
}

namespace {

// run_job over `sh -c script` with the test's io.
LaunchResult job_sh(const std::string& script, LaunchOptions options, Captured& captured,
                    const StopFlag* stop = nullptr,
                    const std::vector<std::string>& env = own_environment()) {
  options.command = {"sh", "-c", script};
  LaunchIo io;
  io.line = [&](int rank, OutputStream stream, std::string_view line) {
    captured.lines.emplace_back(rank, stream, std::string(line));
  };
  io.message = [&](std::string_view m) { captured.messages.emplace_back(m); };
  return run_job(options, sh_path(), env, io, stop);
}

// Options of a job of `processes` ranks under --max-restarts `restarts`, 5 s of grace.
LaunchOptions restart_options(int processes, int restarts, double backoff) {
  LaunchOptions options;
  options.processes = processes;
  options.grace_seconds = 5;
  options.max_restarts = restarts;
  options.restart_backoff = backoff;
  return options;
}

// Shell: waits until `file` exists (at most 10 s), then succeeds only if it does.
std::string wait_for_file(const std::string& file) {
  return fmt::format(
      "i=0; while [ ! -e {0} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; [ -e {0} ]",
      file);
}

}  // namespace

TEST_CASE(
    "--max-restarts --relaunch all: a failed job is relaunched whole, its ranks told which "
    "restart") {
  LaunchOptions options = restart_options(2, 3, 0.05);
  options.relaunch_dead = false;
  SUBCASE("rank 1 fails in the first two attempts: the third succeeds") {
    Captured c;
    const auto t0 = Clock::now();
    auto r = job_sh(
        "echo \"attempt ${ACTORPIPE_RESTART:-0} of ${ACTORPIPE_MAX_RESTARTS:-0}: "
        "${ACTORPIPE_RESTART_REASON:-first}\"; "
        "if [ \"$ACTORPIPE_RANK\" = 1 ] && [ \"${ACTORPIPE_RESTART:-0}\" -lt 2 ]; then exit 5; fi",
        options, c);
    CHECK(r.exit_code == 0);
    CHECK(r.restarts == 2);
    CHECK(seconds_since(t0) >= 0.15);  // 0.05 s, then 0.1 s
    CHECK(c.of(1, OutputStream::out) ==
          std::vector<std::string>{"attempt 0 of 0: first",
                                   "attempt 1 of 3: rank 1 exited with status 5",
                                   "attempt 2 of 3: rank 1 exited with status 5"});
    std::vector<std::string> restarts;
    for (const std::string& m : c.messages)
      if (contains(m, "restarting every rank")) restarts.push_back(m);
    REQUIRE(restarts.size() == 2);
    CHECK(contains(restarts[0],
                   "rank 1 exited with status 5; restarting every rank (restart 1 "
                   "of 3, after 0."));
    CHECK(contains(restarts[1], "(restart 2 of 3, after 0."));
  }
  SUBCASE("past the limit: the last attempt's exit code") {
    Captured c;
    options.max_restarts = 1;
    auto r = job_sh("[ \"$ACTORPIPE_RANK\" = 0 ] && exit 7; exit 0", options, c);
    CHECK(r.exit_code == 7);
    CHECK(r.restarts == 1);
    CHECK(r.failed_rank == 0);
  }
  SUBCASE("a program that cannot start is not relaunched") {
    Captured c;
    options.command = {"/nonexistent/program"};
    LaunchIo io;
    io.line = [](int, OutputStream, std::string_view) {};
    io.message = [&](std::string_view m) { c.messages.emplace_back(m); };
    auto r = run_job(options, "/nonexistent/program", own_environment(), io);
    CHECK(r.exit_code == 127);
    CHECK(r.restarts == 0);
  }
  SUBCASE("a stop asked: no relaunch") {
    Captured c;
    StopFlag stop;
    stop.request(SIGTERM);
    auto r = job_sh("exit 5", options, c, &stop);
    CHECK(r.exit_code == 5);
    CHECK(r.restarts == 0);
  }
  SUBCASE("a rank that exits 3 (kExitNoRestart, a restart cannot help) is not restarted") {
    Captured c;
    auto r = job_sh("[ \"$ACTORPIPE_RANK\" = 1 ] && exit 3; exit 0", options, c);
    CHECK(r.exit_code == kExitNoRestart);
    CHECK(r.restarts == 0);
    CHECK(r.failed_rank == 1);
    for (const std::string& m : c.messages) CHECK_FALSE(contains(m, "restarting every rank"));
    REQUIRE_FALSE(c.messages.empty());
    CHECK(contains(c.messages[0],
                   "rank 1 exited with status 3 (a restart cannot help, it says: not relaunched)"));
  }
}

TEST_CASE(
    "--max-restarts (--relaunch dead): only the dead rank is relaunched, in place, told which "
    "restart, the others live on, told they may rejoin") {
  actorpipe::testing::TempDir dir;
  const std::string done = dir.file("done");
  LaunchOptions options = restart_options(3, 3, 0.05);
  // ranks 0 and 2 live until rank 1 has succeeded (at most 10 s); rank 1 fails `fails` times
  auto script = [&](int fails, int code) {
    return fmt::format(
        "echo \"pid $$ attempt ${{ACTORPIPE_RESTART:-0}} of ${{ACTORPIPE_MAX_RESTARTS:-0}} "
        "rejoin ${{ACTORPIPE_REJOIN:-none}}: ${{ACTORPIPE_RESTART_REASON:-first}}\"; "
        "if [ \"$ACTORPIPE_RANK\" = 1 ]; then "
        "  if [ \"${{ACTORPIPE_RESTART:-0}}\" -lt {0} ]; then exit {1}; fi; touch {2}; exit 0; "
        "fi; {3}",
        fails, code, done, wait_for_file(done));
  };
  SUBCASE("rank 1 fails twice: relaunched twice, ranks 0 and 2 started once") {
    Captured c;
    const auto t0 = Clock::now();
    auto r = job_sh(script(2, 5), options, c);
    CHECK(r.exit_code == 0);
    CHECK(r.restarts == 2);
    CHECK(r.failed_rank == -1);
    CHECK(seconds_since(t0) >= 0.15);  // 0.05 s, then 0.1 s
    const auto one = c.of(1, OutputStream::out);
    REQUIRE(one.size() == 3);
    CHECK(contains(one[0], "attempt 0 of 0 rejoin 3: first"));
    CHECK(contains(one[1], "attempt 1 of 3 rejoin 3: rank 1 exited with status 5"));
    CHECK(contains(one[2], "attempt 2 of 3 rejoin 3: rank 1 exited with status 5"));
    for (const int k : {0, 2}) {
      const auto lines = c.of(k, OutputStream::out);
      REQUIRE(lines.size() == 1);  // started once: it lived on
      CHECK(contains(lines[0], "attempt 0 of 0 rejoin 3: first"));
    }
    std::vector<std::string> relaunched;
    for (const std::string& m : c.messages) {
      CHECK_FALSE(contains(m, "restarting every rank"));
      if (contains(m, "relaunching rank")) relaunched.push_back(m);
    }
    REQUIRE(relaunched.size() == 2);
    CHECK(relaunched[0] ==
          "relaunching rank 1 (restart 1 of 3, after 0.1 s); the other ranks rejoin the job");
    CHECK(contains(relaunched[1], "relaunching rank 1 (restart 2 of 3, after 0.1 s)"));
  }
  SUBCASE("past the limit: the others are stopped, the dead rank's exit code") {
    Captured c;
    auto r = job_sh(script(100, 7), options, c);
    CHECK(r.exit_code == 7);
    CHECK(r.restarts == 3);
    CHECK(r.failed_rank == 1);
    CHECK(c.of(1, OutputStream::out).size() == 4);
    for (const int k : {0, 2}) {
      CHECK(c.of(k, OutputStream::out).size() == 1);
      CHECK(r.ranks[static_cast<std::size_t>(k)].signal == SIGTERM);
    }
  }
  SUBCASE("a rank that exits 3 (kExitNoRestart) is not relaunched: the others are stopped") {
    Captured c;
    auto r = job_sh(script(100, kExitNoRestart), options, c);
    CHECK(r.exit_code == kExitNoRestart);
    CHECK(r.restarts == 0);
    CHECK(r.failed_rank == 1);
    CHECK(c.of(1, OutputStream::out).size() == 1);
    for (const int k : {0, 2}) CHECK(r.ranks[static_cast<std::size_t>(k)].signal == SIGTERM);
    REQUIRE_FALSE(c.messages.empty());
    CHECK(c.messages[0] ==
          "rank 1 exited with status 3 (a restart cannot help, it says: not relaunched); "
          "stopping ranks 0, 2");
  }
  SUBCASE("a rank that fails after another has finished is not relaunched") {
    Captured c;
    auto r = job_sh("[ \"$ACTORPIPE_RANK\" = 2 ] && { sleep 0.3; exit 5; }; exit 0", options, c);
    CHECK(r.exit_code == 5);
    CHECK(r.restarts == 0);
    CHECK(r.failed_rank == 2);
  }
  SUBCASE("a stop asked: the relaunch waiting out its backoff does not happen") {
    Captured c;
    options.restart_backoff = 30;
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    options.command = {"sh", "-c", script(100, 7)};
    LaunchIo io;
    io.line = [&](int rank, OutputStream stream, std::string_view line) {
      c.lines.emplace_back(rank, stream, std::string(line));
    };
    io.message = [&](std::string_view m) {
      c.messages.emplace_back(m);
      // rank 1's death is reported: ask the launcher to stop (as its SIGTERM handler would)
      if (contains(std::string(m), "rank 1 exited with status 7")) {
        const unsigned char sig = SIGTERM;
        REQUIRE(::write(fds[1], &sig, 1) == 1);
      }
    };
    io.interrupt_fd = fds[0];
    const auto t0 = Clock::now();
    auto r = run_job(options, sh_path(), own_environment(), io);
    ::close(fds[0]);
    ::close(fds[1]);
    CHECK(seconds_since(t0) < 20);
    CHECK(r.interrupted);
    CHECK(c.of(1, OutputStream::out).size() == 1);
    for (const std::string& m : c.messages) CHECK_FALSE(contains(m, "relaunching rank"));
  }
}

TEST_CASE("--max-restarts and --restart-backoff are parsed and checked") {
  auto a = parse_launch_args({"-n", "2", "--max-restarts", "5", "--restart-backoff=0.5", "p"});
  REQUIRE(a.ok());
  CHECK(a->max_restarts == 5);
  CHECK(a->restart_backoff == 0.5);
  auto b = parse_launch_args({"-n", "2", "p"});
  REQUIRE(b.ok());
  CHECK(b->max_restarts == 0);
  CHECK(b->restart_backoff == 1.0);
  CHECK(b->relaunch_dead);
  auto e = parse_launch_args({"-n", "2", "--relaunch=all", "p"});
  REQUIRE(e.ok());
  CHECK_FALSE(e->relaunch_dead);
  auto c = parse_launch_args({"-n", "2", "--max-restarts", "1001", "p"});
  REQUIRE_FALSE(c.ok());
  CHECK(contains(c.error().message, "--max-restarts: '1001' is not allowed"));
  auto d = parse_launch_args({"-n", "2", "--restart-backoff", "-1", "p"});
  REQUIRE_FALSE(d.ok());
  CHECK(contains(d.error().message, "--restart-backoff: '-1' is not allowed"));
}

TEST_CASE(
    "--max-restarts: each rank's environment names a failure record of its own, which a process "
    "started in its place finds, and which goes with the job") {
  LaunchOptions options = restart_options(2, 2, 0);
  // every start says its record and what it holds; rank 1 leaves one, then fails, once; rank 0
  // lives until rank 1 has succeeded (at most 10 s: a finished rank ends the relaunches)
  actorpipe::testing::TempDir dir;
  const std::string done = dir.file("done");
  const std::string script = fmt::format(
      "echo \"file ${{ACTORPIPE_FAILURE_FILE:-none}}\"; "
      "if [ -e \"$ACTORPIPE_FAILURE_FILE\" ]; then "
      "  echo \"found $(cat \"$ACTORPIPE_FAILURE_FILE\")\"; fi; "
      "if [ \"$ACTORPIPE_RANK\" = 1 ]; then "
      "  if [ \"${{ACTORPIPE_RESTART:-0}}\" = 0 ]; then "
      "    echo \"left by $$\" > \"$ACTORPIPE_FAILURE_FILE\"; exit 5; fi; "
      "  touch {0}; exit 0; "
      "fi; {1}",
      done, wait_for_file(done));
  auto file_of = [](const Captured& c, int rank) {
    const auto lines = c.of(rank, OutputStream::out);
    REQUIRE_FALSE(lines.empty());
    REQUIRE(lines[0].rfind("file ", 0) == 0);
    return lines[0].substr(5);
  };
  for (const bool dead : {true, false}) {
    CAPTURE(dead);
    options.relaunch_dead = dead;
    std::filesystem::remove(done);
    Captured c;
    auto r = job_sh(script, options, c);
    CHECK(r.exit_code == 0);
    CHECK(r.restarts == 1);
    const std::string zero = file_of(c, 0), one = file_of(c, 1);
    CHECK(zero != one);
    CHECK(contains(one, "/rank-1"));
    CHECK(std::filesystem::path(zero).parent_path() == std::filesystem::path(one).parent_path());
    // the relaunched rank 1 found what its predecessor left
    const auto lines = c.of(1, OutputStream::out);
    REQUIRE(lines.size() == 3);
    CHECK(lines[1] == "file " + one);
    CHECK(contains(lines[2], "found left by "));
    // the records' directory is gone with the job
    CHECK_FALSE(std::filesystem::exists(std::filesystem::path(one).parent_path()));
  }
  {  // without restarts no record is named, and an inherited name is dropped
    options.max_restarts = 0;
    Captured c;
    std::vector<std::string> env = own_environment();
    env.push_back(std::string(cluster_vars::failure_file) + "=/tmp/inherited");
    auto r = job_sh("echo \"file ${ACTORPIPE_FAILURE_FILE:-none}\"", options, c, nullptr, env);
    CHECK(r.exit_code == 0);
    CHECK(file_of(c, 0) == "none");
    CHECK(file_of(c, 1) == "none");
  }
  {  // no directory for the records (TMPDIR=/proc: no one may make one there, root neither): a
     // warning, and the job runs with restarts but without records
    options.max_restarts = 1;
    const char* old = std::getenv("TMPDIR");
    const std::string saved = old != nullptr ? old : "";
    REQUIRE(::setenv("TMPDIR", "/proc", 1) == 0);
    Captured c;
    auto r = job_sh("echo \"file ${ACTORPIPE_FAILURE_FILE:-none}\"", options, c);
    if (old != nullptr)
      ::setenv("TMPDIR", saved.c_str(), 1);
    else
      ::unsetenv("TMPDIR");
    CHECK(r.exit_code == 0);
    CHECK(file_of(c, 0) == "none");
    CHECK(file_of(c, 1) == "none");
    REQUIRE(c.messages.size() == 1);
    CHECK(contains(c.messages[0],
                   "warning: no directory for the ranks' failure records "
                   "(/proc/actorpipe-launch-"));
    CHECK(contains(c.messages[0], "a failure that repeats will be restarted every time"));
  }
}
