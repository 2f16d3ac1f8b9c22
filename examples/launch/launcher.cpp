// actorpipe-launch's process management: fork + execve per rank, one poll loop over the ranks'
// pipes, process descriptors and the launcher's own signals; SIGTERM, then SIGKILL after a grace.
#include "examples/launch/launcher.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/supervisor.hpp"
#include "transport/cluster_env.hpp"

namespace actorpipe {

const char* const kLaunchUsage = R"(usage: actorpipe-launch -n N [options] [--] PROGRAM [ARGS...]
Starts N processes of PROGRAM on this host: ranks 0 to N-1 of one job.
  -n N           number of processes (ranks), 1 to 1024
  --port P       the coordinator's TCP port, 1 to 65535 (default: a free port, picked up front)
  --bind ADDR    numeric IPv4/IPv6 address of this host for the coordinator (default 127.0.0.1)
  --grace S      seconds between SIGTERM and SIGKILL when the job stops, 0 to 3600 (default 10)
  --max-restarts K
                 restart the job after a failure, up to K times, 0 to 1000 (default 0): a dead
                 rank is relaunched with ACTORPIPE_RESTART=k, the others rejoin the job
                 (ACTORPIPE_REJOIN=K), and a trainer resumes from checkpoint.dir; each rank's
                 ACTORPIPE_FAILURE_FILE keeps its last failure for the process started in its
                 place (a trainer failing the same way again exits 3: not restarted)
  --cpu-bind auto|cores|none
                 cores: each rank runs on its own CPUs, an equal share of the launcher's (rank k
                 of N on C CPUs: CPUs k*C/N to (k+1)*C/N - 1 of them); none: no binding; auto
                 (default): cores when N <= C, else none
  --relaunch dead|all
                 dead (default): relaunch only the ranks that died; all: stop every rank and
                 relaunch them all (for programs that do not rejoin)
  --restart-backoff S
                 seconds before the first relaunch, doubled for each next, at most 60 (default 1)
  --help         this text
Each rank's environment: ACTORPIPE_RANK, ACTORPIPE_WORLD, ACTORPIPE_COORDINATOR (ADDR:PORT) and
ACTORPIPE_JOB_SECRET (64 hex digits, fresh for every job). Output lines are prefixed
"[rank K] ". When a rank fails the others get SIGTERM, then SIGKILL after the grace period.
SIGINT and SIGTERM are forwarded to every rank: the first asks them to stop gracefully (a
trainer ends after its step in flight and writes a checkpoint) and waits as long as they take (a
rank exiting with 128 + that signal, or killed by it, stopped as asked and stops no other); a second is forwarded
too, and SIGKILL follows it after the grace period. Exit code: 0 when every rank exits 0, else the
first failing rank's status (128 + signal when a signal killed it); 127: PROGRAM could not be
started; 1: the launcher's own failure; 2: bad arguments. Only local processes: for several hosts
use mpirun, srun or torchrun (see docs/launch.md).
)";

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxLine = 64 * 1024;  // a longer line without '\n' is cut here
constexpr std::chrono::milliseconds kTick{100};
constexpr std::chrono::milliseconds kDrainAfterExit{1000};

Expected<int> parse_int(std::string_view flag, std::string_view text, int lo, int hi) {
  bool digits = !text.empty() && text.size() <= 9;
  for (const char c : text) digits = digits && c >= '0' && c <= '9';
  const long v = digits ? std::strtol(std::string(text).c_str(), nullptr, 10) : -1;
  if (!digits || v < lo || v > hi) {
    return make_error("{}: '{}' is not allowed: expected an integer from {} to {}", flag, text, lo,
                      hi);
  }
  return static_cast<int>(v);
}

Expected<double> parse_seconds(std::string_view flag, std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  const double v = s.empty() ? -1 : std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v) || v < 0 || v > 3600) {
    return make_error("{}: '{}' is not allowed: expected seconds from 0 to 3600", flag, text);
  }
  return v;
}

bool numeric_address(const std::string& text) {
  in_addr v4{};
  in6_addr v6{};
  return ::inet_pton(AF_INET, text.c_str(), &v4) == 1 ||
         ::inet_pton(AF_INET6, text.c_str(), &v6) == 1;
}

bool job_variable(std::string_view entry) {
  const std::string_view name = entry.substr(0, entry.find('='));
  for (const char* v :
       {cluster_vars::rank, cluster_vars::world, cluster_vars::coordinator,
        cluster_vars::job_secret, cluster_vars::job_secret_file, cluster_vars::failure_file}) {
    if (name == v) return true;
  }
  return false;
}

bool restart_variable(std::string_view entry) {
  const std::string_view name = entry.substr(0, entry.find('='));
  return name == "ACTORPIPE_RESTART" || name == "ACTORPIPE_MAX_RESTARTS" ||
         name == "ACTORPIPE_RESTART_REASON";
}

// `env` told that this start is restart `restart` of at most `max` after `reason`.
void add_restart_variables(std::vector<std::string>& env, int restart, int max,
                           const std::string& reason) {
  std::erase_if(env, restart_variable);
  env.push_back(fmt::format("ACTORPIPE_RESTART={}", restart));
  env.push_back(fmt::format("ACTORPIPE_MAX_RESTARTS={}", max));
  env.push_back("ACTORPIPE_RESTART_REASON=" + reason);
}

void write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed terminal or pipe: the text is lost, the job goes on
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return out;
}

// One pipe from a rank: the read end and the part of a line not yet complete.
struct Pipe {
  int fd = -1;
  std::string partial;
};

struct Rank {
  RankOutcome outcome;
  int pidfd = -1;
  Pipe out;
  Pipe err;
  bool reaped = false;
};

int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  return fd >= 0 ? static_cast<int>(fd) : -1;
#else
  (void)pid;
  return -1;
#endif
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Starts one rank bound to `cpus` (empty: not bound); returns 0 or the errno of what failed
// (pipe, fork, the binding, execve), and says in `binding_failed` whether it was the binding.
int spawn(Rank& r, const std::string& program, const std::vector<std::string>& argv,
          const std::vector<std::string>& env, const std::vector<int>& cpus, int devnull,
          bool& binding_failed) {
  binding_failed = false;
  int out[2] = {-1, -1};
  int err[2] = {-1, -1};
  int status[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 ||
      ::pipe2(status, O_CLOEXEC) != 0) {
    const int e = errno;
    for (int* p : {out, err, status}) {
      close_fd(p[0]);
      close_fd(p[1]);
    }
    return e;
  }
  // everything the child needs is prepared before fork: after it, only async-signal-safe calls
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigset_t no_signals;
  sigemptyset(&no_signals);
  const pid_t launcher = ::getpid();
  // the rank's CPU set, sized for the highest CPU number (no limit of CPU_SETSIZE)
  const int max_cpu = cpus.empty() ? 0 : *std::max_element(cpus.begin(), cpus.end());
  cpu_set_t* cpu_set = cpus.empty() ? nullptr : CPU_ALLOC(max_cpu + 1);
  const std::size_t cpu_set_size = CPU_ALLOC_SIZE(max_cpu + 1);
  if (cpu_set != nullptr) {
    CPU_ZERO_S(cpu_set_size, cpu_set);
    for (const int c : cpus) CPU_SET_S(static_cast<std::size_t>(c), cpu_set_size, cpu_set);
  }

  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    for (int* p : {out, err, status}) {
      close_fd(p[0]);
      close_fd(p[1]);
    }
    if (cpu_set != nullptr) CPU_FREE(cpu_set);
    return e;
  }
  if (pid == 0) {
    // before execve: every thread the program starts inherits the set. A failure is sent as a
    // negative errno, to tell it from execve's.
    if (cpu_set != nullptr && ::sched_setaffinity(0, cpu_set_size, cpu_set) != 0) {
      const int e = -errno;
      (void)!::write(status[1], &e, sizeof e);
      ::_exit(127);
    }
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) ::_exit(127);  // the launcher died before prctl
    for (const int sig : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD}) ::sigaction(sig, &dfl, nullptr);
    ::sigprocmask(SIG_SETMASK, &no_signals, nullptr);
    if (::dup2(devnull, 0) < 0 || ::dup2(out[1], 1) < 0 || ::dup2(err[1], 2) < 0) {
      const int e = errno;
      (void)!::write(status[1], &e, sizeof e);
      ::_exit(127);
    }
    ::execve(program.c_str(), args.data(), envp.data());
    const int e = errno;
    (void)!::write(status[1], &e, sizeof e);
    ::_exit(127);
  }
  if (cpu_set != nullptr) CPU_FREE(cpu_set);
  ::setpgid(pid, pid);  // also here, so that no signal to the group can come before it exists
  ::close(out[1]);
  ::close(err[1]);
  ::close(status[1]);
  int exec_error = 0;
  ssize_t n = 0;
  do {
    n = ::read(status[0], &exec_error, sizeof exec_error);
  } while (n < 0 && errno == EINTR);
  ::close(status[0]);
  if (n == static_cast<ssize_t>(sizeof exec_error)) {  // the binding or execve failed; it exited
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    ::close(out[0]);
    ::close(err[0]);
    binding_failed = exec_error < 0;
    return exec_error < 0 ? -exec_error : exec_error;
  }
  ::fcntl(out[0], F_SETFL, ::fcntl(out[0], F_GETFL) | O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, ::fcntl(err[0], F_GETFL) | O_NONBLOCK);
  r.out.fd = out[0];
  r.err.fd = err[0];
  r.pidfd = open_pidfd(pid);
  r.outcome.pid = pid;
  r.outcome.started = true;
  return 0;
}

// Reads what `pipe` holds (at most `max_reads` chunks) and hands out its complete lines; at end
// of file, the rest as a last line.
void drain(Pipe& pipe, int rank, OutputStream stream, const LaunchIo& io, int max_reads) {
  char buf[65536];
  for (int i = 0; pipe.fd >= 0 && i < max_reads; ++i) {
    const ssize_t n = ::read(pipe.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {  // end of file (or an error, which ends the stream too)
      if (!pipe.partial.empty()) io.line(rank, stream, pipe.partial);
      pipe.partial.clear();
      close_fd(pipe.fd);
      return;
    }
    pipe.partial.append(buf, static_cast<std::size_t>(n));
    std::size_t start = 0;
    for (;;) {
      const std::size_t nl = pipe.partial.find('\n', start);
      if (nl == std::string::npos) break;
      io.line(rank, stream, std::string_view(pipe.partial).substr(start, nl - start));
      start = nl + 1;
    }
    pipe.partial.erase(0, start);
    while (pipe.partial.size() >= kMaxLine) {
      io.line(rank, stream, std::string_view(pipe.partial).substr(0, kMaxLine));
      pipe.partial.erase(0, kMaxLine);
    }
  }
}

void close_pipe(Pipe& pipe, int rank, OutputStream stream, const LaunchIo& io) {
  if (pipe.fd < 0) return;
  if (!pipe.partial.empty()) io.line(rank, stream, pipe.partial);
  pipe.partial.clear();
  close_fd(pipe.fd);
}

// Sends `sig` to the process group of each rank (the rank and whatever it started); to the rank
// alone if it has left its group.
void signal_ranks(std::vector<Rank>& ranks, const std::vector<int>& which, int sig) {
  for (const int k : which) {
    const pid_t pid = ranks[static_cast<std::size_t>(k)].outcome.pid;
    if (::kill(-pid, sig) != 0) ::kill(pid, sig);
  }
}

}  // namespace

Expected<CpuBind> parse_cpu_bind(std::string_view text) {
  if (text == "auto") return CpuBind::automatic;
  if (text == "cores") return CpuBind::cores;
  if (text == "none") return CpuBind::none;
  return make_error("--cpu-bind: '{}' is not allowed: expected auto, cores or none", text);
}

Expected<LaunchOptions> parse_launch_args(const std::vector<std::string>& args) {
  LaunchOptions o;
  bool n_given = false;
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-' || arg == "-") break;  // the command starts here
    if (arg == "--help" || arg == "-h") {
      o.help = true;
      continue;
    }
    // "--opt value" or "--opt=value"
    std::string name = arg;
    std::optional<std::string> value;
    if (const std::size_t eq = arg.find('='); eq != std::string::npos && arg.rfind("--", 0) == 0) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    if (name == "--hosts" || name == "-H" || name == "--host" || name == "--hostfile") {
      return make_error(
          "{}: actorpipe-launch starts local processes only (several hosts are not supported); "
          "start a job across hosts with mpirun, srun or torchrun (see docs/launch.md)",
          name);
    }
    if (name != "-n" && name != "--port" && name != "--bind" && name != "--grace" &&
        name != "--max-restarts" && name != "--restart-backoff" && name != "--relaunch" &&
        name != "--cpu-bind") {
      return make_error(
          "unknown argument '{}'; allowed: -n N, --port P, --bind ADDR, --grace S, "
          "--max-restarts K, --relaunch dead|all, --restart-backoff S, --cpu-bind "
          "auto|cores|none, --help, then [--] PROGRAM ARGS...",
          arg);
    }
    if (!value) {
      if (i + 1 >= args.size()) return make_error("{} needs a value (see --help)", name);
      value = args[++i];
    }
    if (name == "-n") {
      auto n = parse_int("-n", *value, 1, kMaxLocalRanks);
      if (!n) return n.error();
      o.processes = *n;
      n_given = true;
    } else if (name == "--port") {
      auto p = parse_int("--port", *value, 1, 65535);
      if (!p) return p.error();
      o.port = *p;
    } else if (name == "--bind") {
      if (!numeric_address(*value)) {
        return make_error(
            "--bind: '{}' is not allowed: expected a numeric IPv4 or IPv6 address of this host "
            "(e.g. 127.0.0.1)",
            *value);
      }
      o.bind = *value;
    } else if (name == "--max-restarts") {
      auto k = parse_int("--max-restarts", *value, 0, 1000);
      if (!k) return k.error();
      o.max_restarts = *k;
    } else if (name == "--relaunch") {
      if (*value != "dead" && *value != "all") {
        return make_error("--relaunch: '{}' is not allowed: expected dead or all", *value);
      }
      o.relaunch_dead = *value == "dead";
    } else if (name == "--cpu-bind") {
      auto bind = parse_cpu_bind(*value);
      if (!bind) return bind.error();
      o.cpu_bind = *bind;
    } else if (name == "--restart-backoff") {
      auto b = parse_seconds("--restart-backoff", *value);
      if (!b) return b.error();
      o.restart_backoff = *b;
    } else {
      auto g = parse_seconds("--grace", *value);
      if (!g) return g.error();
      o.grace_seconds = *g;
    }
  }
  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(std::min(i, args.size())),
                   args.end());
  if (o.help) return o;
  if (!n_given) {
    return make_error("-n is missing: expected the number of processes, an integer from 1 to {}",
                      kMaxLocalRanks);
  }
  if (o.command.empty()) {
    return make_error(
        "no program given: expected actorpipe-launch -n N [options] -- PROGRAM "
        "ARGS...");
  }
  return o;
}

Expected<std::string> make_job_secret() {
  unsigned char bytes[32];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return make_error("cannot read random bytes (getrandom): {}", std::strerror(errno));
    got += static_cast<std::size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (const unsigned char b : bytes) {
    hex += kHex[b >> 4];
    hex += kHex[b & 15];
  }
  return hex;
}

std::vector<std::string> rank_environment(const std::vector<std::string>& base, int rank, int world,
                                          const std::string& coordinator,
                                          const std::string& secret) {
  std::vector<std::string> env;
  for (const std::string& e : base) {
    if (!job_variable(e)) env.push_back(e);
  }
  env.push_back(fmt::format("{}={}", cluster_vars::rank, rank));
  env.push_back(fmt::format("{}={}", cluster_vars::world, world));
  env.push_back(fmt::format("{}={}", cluster_vars::coordinator, coordinator));
  env.push_back(fmt::format("{}={}", cluster_vars::job_secret, secret));
  return env;
}

Expected<std::string> resolve_program(const std::string& program, const std::string& path) {
  auto runnable = [](const std::string& file) {
    struct stat st {};
    return ::stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
           ::access(file.c_str(), X_OK) == 0;
  };
  if (program.empty()) return make_error("PROGRAM: '' is not allowed: expected a program");
  if (program.find('/') != std::string::npos) {
    if (!runnable(program)) {
      struct stat st {};
      const bool exists = ::stat(program.c_str(), &st) == 0;
      return make_error("PROGRAM: '{}' is not allowed: {}", program,
                        exists ? "it is not an executable file" : "no such file");
    }
    return program;
  }
  const std::string dirs = path.empty() ? "/bin:/usr/bin" : path;
  std::size_t start = 0;
  while (start <= dirs.size()) {
    std::size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end == start ? "." : dirs.substr(start, end - start);
    const std::string file = dir + "/" + program;
    if (runnable(file)) return file;
    start = end + 1;
  }
  return make_error(
      "PROGRAM: '{}' is not found in PATH ({}): expected a program in PATH or a "
      "path to an executable file",
      program, dirs);
}

Expected<LaunchPlan> plan_launch(const LaunchOptions& options, const std::string& program,
                                 const std::vector<std::string>& base_env) {
  LaunchPlan plan;
  // held until the job ends: rank 0 binds it beside this socket (started again too), and no
  // other program's connect() or bind takes it meanwhile
  auto reserved = PortReservation::reserve(options.bind, options.port);
  if (!reserved) {
    if (options.port == 0) return reserved.error();
    return make_error("--port: {} is not available: {}", options.port, reserved.error().message);
  }
  const int port = reserved->port();
  plan.port = std::make_shared<const PortReservation>(std::move(*reserved));
  auto secret = make_job_secret();
  if (!secret) return secret.error();
  plan.program = program;
  plan.argv = options.command;
  plan.coordinator = format_host_port(options.bind, port);
  plan.secret = *secret;
  plan.grace_seconds = options.grace_seconds;
  for (int k = 0; k < options.processes; ++k) {
    plan.env.push_back(
        rank_environment(base_env, k, options.processes, plan.coordinator, plan.secret));
  }
  auto cpus = plan_cpu_binding(options.cpu_bind, options.processes, allowed_cpus());
  if (!cpus) return cpus.error();
  plan.cpus = std::move(*cpus);
  return plan;
}

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  // sized up until the kernel's mask fits (EINVAL: the set is smaller than the kernel's)
  for (int n = 1024; n <= (1 << 20); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    const std::size_t size = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(size, set);
    if (::sched_getaffinity(0, size, set) == 0) {
      for (int c = 0; c < n; ++c) {
        if (CPU_ISSET_S(static_cast<std::size_t>(c), size, set)) cpus.push_back(c);
      }
      CPU_FREE(set);
      return cpus;
    }
    const int e = errno;
    CPU_FREE(set);
    if (e != EINVAL) break;
  }
  return cpus;  // unknown: empty, so that nothing is bound
}

Expected<std::vector<std::vector<int>>> plan_cpu_binding(CpuBind mode, int ranks,
                                                         const std::vector<int>& cpus) {
  const auto count = static_cast<long>(cpus.size());
  if (mode == CpuBind::cores && ranks > count) {
    return make_error(
        "--cpu-bind cores: {} ranks need at least {} CPUs, and this launcher may run on {} ({}); "
        "use --cpu-bind none or fewer ranks",
        ranks, ranks, count, count == 0 ? "none known" : cpu_list_text(cpus));
  }
  std::vector<std::vector<int>> out(static_cast<std::size_t>(std::max(ranks, 0)));
  if (mode == CpuBind::none || ranks > count) return out;  // automatic with too few CPUs
  for (long k = 0; k < ranks; ++k) {
    for (long i = k * count / ranks; i < (k + 1) * count / ranks; ++i)
      out[static_cast<std::size_t>(k)].push_back(cpus[static_cast<std::size_t>(i)]);
  }
  return out;
}

std::string cpu_list_text(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

std::string prefixed_line(int rank, std::string_view line) {
  std::string text = fmt::format("[rank {}] ", rank);
  text.append(line);
  text += '\n';
  return text;
}

LaunchIo launch_io_to(int out_fd, int err_fd) {
  LaunchIo io;
  io.line = [out_fd, err_fd](int rank, OutputStream stream, std::string_view line) {
    write_all(stream == OutputStream::out ? out_fd : err_fd, prefixed_line(rank, line));
  };
  io.message = [err_fd](std::string_view message) {
    write_all(err_fd, fmt::format("actorpipe-launch: {}\n", message));
  };
  return io;
}

std::string describe_outcome(const RankOutcome& o) {
  if (!o.started) return fmt::format("rank {} was not started", o.rank);
  if (o.exited)
    return fmt::format(
        "rank {} exited with status {}{}", o.rank, o.status,
        o.status == kExitNoRestart ? " (a restart cannot help, it says: not relaunched)" : "");
  return fmt::format("rank {} killed by signal {} ({})", o.rank, o.signal, signal_name(o.signal));
}

LaunchResult run_launch(const LaunchPlan& plan, const LaunchIo& io) {
  const int world = static_cast<int>(plan.env.size());
  std::vector<Rank> ranks(static_cast<std::size_t>(world));
  for (int k = 0; k < world; ++k) ranks[static_cast<std::size_t>(k)].outcome.rank = k;
  LaunchResult result;
  const auto grace = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(plan.grace_seconds));

  bool stopping = false;  // SIGTERM (or a forwarded signal) has gone out; SIGKILL at `deadline`
  bool killed = false;
  int stop_signal = SIGTERM;
  Clock::time_point deadline;
  bool draining = false;  // every rank has been reaped; the pipes get until `drain_end`
  Clock::time_point drain_end;
  int interrupt_fd = io.interrupt_fd;
  int forwarded = 0;         // signals forwarded to the ranks
  int forwarded_signal = 0;  // the first of them
  // dead ranks waiting to be relaunched in place (plan.relaunches), by when
  struct Relaunch {
    int rank;
    Clock::time_point at;
    int restart;
    double wait;
    std::string reason;
  };
  std::vector<Relaunch> relaunches;
  const Supervisor backoff({plan.relaunches, plan.relaunch_backoff, 60.0});

  auto live = [&] {
    std::vector<int> out;
    for (const Rank& r : ranks) {
      if (r.outcome.started && !r.reaped) out.push_back(r.outcome.rank);
    }
    return out;
  };
  auto start_stop = [&](int sig) {
    stopping = true;
    stop_signal = sig;
    deadline = Clock::now() + grace;
  };

  // Starts rank k with `env` (0, or the errno of what failed); a rank that cannot start stops
  // those already running.
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  auto start_rank = [&](int k, const std::vector<std::string>& env) {
    static const std::vector<int> unbound;
    const std::vector<int>& cpus = static_cast<std::size_t>(k) < plan.cpus.size()
                                       ? plan.cpus[static_cast<std::size_t>(k)]
                                       : unbound;
    bool binding_failed = false;
    const int e = devnull < 0 ? errno
                              : spawn(ranks[static_cast<std::size_t>(k)], plan.program, plan.argv,
                                      env, cpus, devnull, binding_failed);
    if (e == 0) return 0;
    result.failed_rank = k;
    result.exit_code = 127;
    const std::vector<int> running = live();
    const std::string what = binding_failed
                                 ? fmt::format("cannot bind it to CPUs {}", cpu_list_text(cpus))
                                 : plan.program;
    io.message(fmt::format("cannot start rank {}: {}: {}{}", k, what, std::strerror(e),
                           running.empty() ? "" : "; stopping " + rank_list(running)));
    signal_ranks(ranks, running, SIGTERM);
    start_stop(SIGTERM);
    return e;
  };
  for (int k = 0; k < world; ++k) {
    if (start_rank(k, plan.env[static_cast<std::size_t>(k)]) != 0) break;
  }

  for (;;) {
    // Reap the ranks that have ended.
    for (Rank& r : ranks) {
      if (!r.outcome.started || r.reaped) continue;
      int st = 0;
      const pid_t w = ::waitpid(r.outcome.pid, &st, WNOHANG);
      if (w == 0 || (w < 0 && errno == EINTR)) continue;
      // its last output comes before any message about it
      drain(r.out, r.outcome.rank, OutputStream::out, io, 256);
      drain(r.err, r.outcome.rank, OutputStream::err, io, 256);
      r.reaped = true;
      close_fd(r.pidfd);
      if (w < 0) {  // someone else reaped it: its status is lost
        r.outcome.exited = true;
        r.outcome.status = 255;
      } else if (WIFEXITED(st)) {
        r.outcome.exited = true;
        r.outcome.status = WEXITSTATUS(st);
      } else {
        r.outcome.signal = WTERMSIG(st);
      }
      const bool failed = !r.outcome.exited || r.outcome.status != 0;
      if (!failed || result.failed_rank >= 0) continue;
      // (not once a rank has finished: the job is ending, nobody would rejoin)
      const bool one_done = std::any_of(ranks.begin(), ranks.end(), [](const Rank& x) {
        return x.reaped && x.outcome.exited && x.outcome.status == 0;
      });
      const bool final_status = r.outcome.exited && r.outcome.status == kExitNoRestart;
      if (!stopping && forwarded_signal == 0 && !one_done && !final_status &&
          result.restarts < plan.relaunches) {
        // the others rejoin the job; this rank is started again in its place after the backoff
        const int k = ++result.restarts;
        const double wait = backoff.backoff(k);
        relaunches.push_back({r.outcome.rank,
                              Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(wait)),
                              k, wait, describe_outcome(r.outcome)});
        io.message(describe_outcome(r.outcome));
        continue;
      }
      result.failed_rank = r.outcome.rank;
      result.exit_code = r.outcome.exited ? r.outcome.status : 128 + r.outcome.signal;
      const std::vector<int> others = live();
      // a rank that ends with 128 + the signal forwarded to it, or killed by it, stopped as
      // asked: the others are stopping the same way (they may still be writing their part of a
      // checkpoint)
      const bool as_asked =
          forwarded_signal > 0 && (r.outcome.exited ? r.outcome.status == 128 + forwarded_signal
                                                    : r.outcome.signal == forwarded_signal);
      if (stopping || others.empty() || as_asked) {
        io.message(describe_outcome(r.outcome));
      } else {
        io.message(fmt::format("{}; stopping {}", describe_outcome(r.outcome), rank_list(others)));
        signal_ranks(ranks, others, SIGTERM);
        start_stop(SIGTERM);
      }
    }

    // Relaunch the dead ranks whose backoff has passed (none once a stop is under way).
    if (stopping || forwarded_signal != 0) relaunches.clear();
    for (auto it = relaunches.begin(); it != relaunches.end();) {
      if (Clock::now() < it->at) {
        ++it;
        continue;
      }
      Rank& r = ranks[static_cast<std::size_t>(it->rank)];
      close_pipe(r.out, it->rank, OutputStream::out, io);
      close_pipe(r.err, it->rank, OutputStream::err, io);
      r = Rank{};
      r.outcome.rank = it->rank;
      std::vector<std::string> env = plan.env[static_cast<std::size_t>(it->rank)];
      add_restart_variables(env, it->restart, plan.relaunches, it->reason);
      io.message(fmt::format(
          "relaunching rank {} (restart {} of {}, after {:.1f} s); the other ranks rejoin the job",
          it->rank, it->restart, plan.relaunches, it->wait));
      if (start_rank(it->rank, env) != 0) {
        relaunches.clear();
        break;
      }
      it = relaunches.erase(it);
    }

    const Clock::time_point now = Clock::now();
    const bool all_reaped = live().empty() && relaunches.empty();
    if (all_reaped) {
      const bool pipes_open = std::any_of(
          ranks.begin(), ranks.end(), [](const Rank& r) { return r.out.fd >= 0 || r.err.fd >= 0; });
      if (!pipes_open) break;
      if (!draining) {
        draining = true;
        drain_end = now + kDrainAfterExit;
      } else if (now >= drain_end) {
        break;  // something the ranks started still holds their pipes; stop reading them
      }
    }
    if (stopping && !killed && !all_reaped && now >= deadline) {
      const std::vector<int> survivors = live();
      io.message(fmt::format("{} still running {:g} s after {}; sending SIGKILL",
                             rank_list(survivors), plan.grace_seconds, signal_name(stop_signal)));
      signal_ranks(ranks, survivors, SIGKILL);
      killed = true;
    }

    // Wait for output, an exit, a signal or the next deadline.
    // fds[i] belongs to ranks[owner[i]] (its stdout, its stderr or its process descriptor), or
    // is the interrupt pipe (owner -1)
    std::vector<pollfd> fds;
    std::vector<int> owner;
    bool need_tick = false;
    for (std::size_t k = 0; k < ranks.size(); ++k) {
      const Rank& r = ranks[k];
      for (const int fd : {r.out.fd, r.err.fd}) {
        if (fd < 0) continue;
        fds.push_back({fd, POLLIN, 0});
        owner.push_back(static_cast<int>(k));
      }
      if (r.outcome.started && !r.reaped) {
        if (r.pidfd >= 0) {
          fds.push_back({r.pidfd, POLLIN, 0});
          owner.push_back(static_cast<int>(k));
        } else {
          need_tick = true;  // no process descriptor: look again at the next tick
        }
      }
    }
    if (interrupt_fd >= 0) {
      fds.push_back({interrupt_fd, POLLIN, 0});
      owner.push_back(-1);
    }
    Clock::duration wait = Clock::duration::max();
    if (need_tick) wait = kTick;
    if (stopping && !killed && !all_reaped) wait = std::min(wait, deadline - now);
    for (const Relaunch& x : relaunches)
      wait = std::min(wait, std::max(x.at - now, Clock::duration{}));
    if (draining) wait = std::min(wait, drain_end - now);
    int timeout_ms = -1;
    if (wait != Clock::duration::max()) {
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(wait).count();
      timeout_ms = static_cast<int>(std::clamp<long long>(ms, 0, 60000));
    }
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0) continue;  // EINTR: a signal; its byte is in the interrupt pipe

    bool interrupted = false;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (owner[i] < 0) {
        interrupted = true;
        continue;
      }
      // a process descriptor needs nothing here: the reaping above looks at every rank
      Rank& r = ranks[static_cast<std::size_t>(owner[i])];
      if (fds[i].fd == r.out.fd) drain(r.out, r.outcome.rank, OutputStream::out, io, 16);
      if (fds[i].fd == r.err.fd) drain(r.err, r.outcome.rank, OutputStream::err, io, 16);
    }
    if (interrupted) {
      unsigned char sigs[64];
      const ssize_t n = ::read(interrupt_fd, sigs, sizeof sigs);
      if (n == 0) interrupt_fd = -1;  // the writer has gone: nothing more to forward
      for (ssize_t i = 0; i < n; ++i) {
        const int sig = sigs[i];
        const std::vector<int> running = live();
        io.message(running.empty() ? fmt::format("received {}", signal_name(sig))
                                   : fmt::format("received {}; forwarding it to {}",
                                                 signal_name(sig), rank_list(running)));
        signal_ranks(ranks, running, sig);
        // the first one asks the ranks to stop gracefully (a trainer finishes its step and
        // writes a checkpoint, however long that takes); from the second on they stop at once,
        // and SIGKILL follows after the grace
        if (forwarded_signal == 0) forwarded_signal = sig;
        result.interrupted = true;
        if (++forwarded > 1 && !stopping) start_stop(sig);
      }
    }
  }

  if (devnull >= 0) ::close(devnull);
  for (Rank& r : ranks) {
    close_pipe(r.out, r.outcome.rank, OutputStream::out, io);
    close_pipe(r.err, r.outcome.rank, OutputStream::err, io);
    close_fd(r.pidfd);
    result.ranks.push_back(r.outcome);
  }
  return result;
}

namespace {

// Under --max-restarts: a directory of the job's own for the ranks' failure records
// (cluster_vars::failure_file), removed with what it holds when the job ends.
class FailureRecords {
 public:
  explicit FailureRecords(const LaunchIo& io) {
    std::error_code ec;
    std::string pattern =
        (std::filesystem::temp_directory_path(ec) / "actorpipe-launch-XXXXXX").string();
    if (ec) pattern = "/tmp/actorpipe-launch-XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) {
      dir_ = pattern;
    } else {
      io.message(fmt::format(
          "warning: no directory for the ranks' failure records ({}: {}); a failure that "
          "repeats will be restarted every time",
          pattern, std::strerror(errno)));
    }
  }
  ~FailureRecords() {
    if (dir_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  FailureRecords(const FailureRecords&) = delete;
  FailureRecords& operator=(const FailureRecords&) = delete;

  // Each rank's environment names its own record (none where the directory could not be
  // made: the ranks then cannot tell a repeated failure, and the job runs as before).
  void add_to(LaunchPlan& plan) const {
    if (dir_.empty()) return;
    for (std::size_t k = 0; k < plan.env.size(); ++k)
      plan.env[k].push_back(fmt::format("{}={}/rank-{}", cluster_vars::failure_file, dir_, k));
  }

 private:
  std::string dir_;
};

}  // namespace

LaunchResult run_job(const LaunchOptions& options, const std::string& program,
                     const std::vector<std::string>& base_env, const LaunchIo& io,
                     const StopFlag* stop) {
  LaunchResult last;
  std::optional<FailureRecords> records;
  if (options.max_restarts > 0) records.emplace(io);
  int restart = 0;
  std::string reason;
  std::vector<std::string> clean = base_env;
  std::erase_if(clean, [](const std::string& e) {
    return restart_variable(e) || e.rfind("ACTORPIPE_REJOIN=", 0) == 0;
  });
  if (options.relaunch_dead && options.max_restarts > 0) {
    // one plan: the dead ranks are relaunched into it, the others rejoin it
    clean.push_back(fmt::format("ACTORPIPE_REJOIN={}", options.max_restarts));
    auto plan = plan_launch(options, program, clean);
    if (!plan) {
      io.message(plan.error().message);
      last.exit_code = 1;
      return last;
    }
    plan->relaunches = options.max_restarts;
    plan->relaunch_backoff = options.restart_backoff;
    records->add_to(*plan);
    return run_launch(*plan, io);
  }
  auto attempt = [&]() -> Status {
    std::vector<std::string> env = clean;
    if (restart > 0) add_restart_variables(env, restart, options.max_restarts, reason);
    auto plan = plan_launch(options, program, env);
    if (!plan) {
      io.message(plan.error().message);
      last = LaunchResult{};
      last.exit_code = 1;
      return {};  // the launcher's own failure: not the job's
    }
    if (records) records->add_to(*plan);
    last = run_launch(*plan, io);
    if (last.exit_code == 0 || last.exit_code == 127 || last.exit_code == kExitNoRestart ||
        last.interrupted)
      return {};
    if (last.failed_rank < 0) return make_error("the job failed (exit code {})", last.exit_code);
    return Error{describe_outcome(last.ranks[static_cast<std::size_t>(last.failed_rank)])};
  };
  Supervisor supervisor({options.max_restarts, options.restart_backoff, 60.0});
  // the job's outcome is `last`; a failure past the limit is in it already
  (void)supervisor.run(
      attempt,
      [&](const RestartEvent& e) -> Status {
        restart = e.restart;
        reason = e.error;
        io.message(fmt::format("{}; restarting every rank (restart {} of {}, after {:.1f} s)",
                               e.error, e.restart, e.max_restarts, e.waited));
        return {};
      },
      stop);
  last.restarts = restart;
  return last;
}

}  // namespace actorpipe
