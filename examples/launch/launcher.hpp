// actorpipe-launch's process management: starts N local ranks of one program with their rank,
// world, coordinator and job secret in the environment, prefixes their output, stops them together.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/expected.hpp"
#include "engine/stop_flag.hpp"
#include "transport/cluster_env.hpp"
#include "transport/port_reservation.hpp"

namespace actorpipe {

/// The most processes actorpipe-launch starts.
inline constexpr int kMaxLocalRanks = 1024;

/// --cpu-bind: which CPUs each rank may run on.
enum class CpuBind {
  automatic,  ///< auto: `cores` when every rank gets at least one CPU, else `none`
  cores,      ///< each rank its own CPUs: an equal share of the launcher's, in order
  none,       ///< every rank the launcher's CPUs (the scheduler places the threads)
};

/// "auto", "cores" or "none"; an error naming the value otherwise.
Expected<CpuBind> parse_cpu_bind(std::string_view text);

/// actorpipe-launch's command line.
struct LaunchOptions {
  int processes = 0;               ///< -n N: ranks to start, 1 to kMaxLocalRanks
  int port = 0;                    ///< --port P; 0: pick a free port on `bind`
  std::string bind = "127.0.0.1";  ///< --bind ADDR: numeric IPv4 or IPv6 address of this host
  double grace_seconds = 10;       ///< --grace S: SIGTERM to SIGKILL, 0 to 3600
  int max_restarts = 0;            ///< --max-restarts K: relaunches of a failed job, 0 to 1000
  double restart_backoff = 1.0;    ///< --restart-backoff S: wait before the first, 0 to 3600
  bool relaunch_dead = true;       ///< --relaunch dead|all: the dead ranks only, or every rank
  CpuBind cpu_bind = CpuBind::automatic;  ///< --cpu-bind auto|cores|none
  std::vector<std::string> command;       ///< PROGRAM ARGS...
  bool help = false;                      ///< --help
};

/// actorpipe-launch's usage text.
extern const char* const kLaunchUsage;

/// Parses actorpipe-launch's arguments (without the program name). Options come first; "--" or
/// the first argument that is no option starts the command. Errors are one line naming the
/// argument, its value and what is allowed.
Expected<LaunchOptions> parse_launch_args(const std::vector<std::string>& args);

/// 32 random bytes from the kernel (getrandom), as 64 lowercase hex digits.
Expected<std::string> make_job_secret();

/// The environment of one rank: `base` ("NAME=value" entries) without any ACTORPIPE_RANK,
/// ACTORPIPE_WORLD, ACTORPIPE_COORDINATOR, ACTORPIPE_JOB_SECRET or ACTORPIPE_JOB_SECRET_FILE, then
/// those set for this job (no secret file).
std::vector<std::string> rank_environment(const std::vector<std::string>& base, int rank, int world,
                                          const std::string& coordinator,
                                          const std::string& secret);

/// The file `program` names: itself when it holds a '/', else the first executable regular file
/// of that name in `path` (a PATH value; an empty entry is the current folder).
Expected<std::string> resolve_program(const std::string& program, const std::string& path);

/// The CPUs the calling thread may run on (sched_getaffinity), ascending.
std::vector<int> allowed_cpus();

/// The CPUs of each of `ranks` ranks under `mode`, from `cpus` (the launcher's, ascending): with
/// `cores`, rank k gets cpus[k·C/N, (k+1)·C/N) (C CPUs, N ranks: disjoint, in order, sizes
/// differing by at most one); with `none`, every list is empty (no binding); `automatic` is
/// `cores` when N <= C, else `none`. Error: `cores` with more ranks than CPUs, naming both.
Expected<std::vector<std::vector<int>>> plan_cpu_binding(CpuBind mode, int ranks,
                                                         const std::vector<int>& cpus);

/// "0-3,6" for {0, 1, 2, 3, 6}: the form of /proc's Cpus_allowed_list.
std::string cpu_list_text(const std::vector<int>& cpus);

/// Everything needed to start the ranks.
struct LaunchPlan {
  std::string program;                        ///< resolved file to execute
  std::vector<std::string> argv;              ///< argv[0] as given, then the arguments
  std::vector<std::vector<std::string>> env;  ///< per rank
  /// Per rank, the CPUs it is bound to before it starts (a relaunch too); empty: not bound.
  std::vector<std::vector<int>> cpus;
  std::string coordinator;  ///< host:port given to every rank
  /// The coordinator's port, held from the plan until the last copy of the plan is gone.
  std::shared_ptr<const PortReservation> port;
  std::string secret;  ///< 64 hex digits
  double grace_seconds = 10;
  /// Ranks that failed are relaunched in place, this many times in all (--relaunch dead): the
  /// others go on (and rejoin the job); 0: a failure stops every rank.
  int relaunches = 0;
  double relaunch_backoff = 1.0;  ///< before the first relaunch, doubled for each next
};

/// Reserves the coordinator's port (options.port, or a free one when 0; an error naming
/// --port when it is not available), makes a secret and builds each rank's environment from
/// `base_env`. `program` is the resolved program file (resolve_program).
Expected<LaunchPlan> plan_launch(const LaunchOptions& options, const std::string& program,
                                 const std::vector<std::string>& base_env);

/// The stream a line came from.
enum class OutputStream { out, err };

/// Where the launcher's output goes.
struct LaunchIo {
  /// One complete line of a rank's output, without its newline.
  std::function<void(int rank, OutputStream stream, std::string_view line)> line;
  /// One message of the launcher itself, without the "actorpipe-launch: " prefix or newline.
  std::function<void(std::string_view message)> message;
  /// When >= 0, every byte read from this descriptor is a signal number that the launcher
  /// received (written by its signal handler): forwarded to every rank still running.
  int interrupt_fd = -1;
};

/// Writes each rank's stdout lines to `out_fd` and its stderr lines and the launcher's messages
/// to `err_fd`, as "[rank K] line\n" and "actorpipe-launch: message\n", each with one write(2), so
/// that lines never mix.
LaunchIo launch_io_to(int out_fd, int err_fd);

/// "[rank K] " + line + "\n".
std::string prefixed_line(int rank, std::string_view line);

/// How one rank ended.
struct RankOutcome {
  int rank = 0;
  pid_t pid = -1;
  bool started = false;  ///< false: could not be started (or was not, after an earlier failure)
  bool exited = false;   ///< exited normally with `status`
  int status = 0;
  int signal = 0;  ///< killed by this signal
};

/// "rank 1 exited with status 1", "rank 2 killed by signal 9 (SIGKILL)", "rank 0 exited with
/// status 3 (a restart cannot help, it says: not relaunched)" (kExitNoRestart,
/// transport/cluster_env.hpp).
std::string describe_outcome(const RankOutcome& outcome);

/// What happened to the job.
struct LaunchResult {
  int exit_code = 0;     ///< 0; the first failing rank's status, or 128 + its signal; 127: a rank
                         ///< could not be started
  int failed_rank = -1;  ///< the first rank that failed, -1 when none did
  std::vector<RankOutcome> ranks;
  bool interrupted = false;  ///< a signal was forwarded to the ranks (a stop was asked)
  int restarts = 0;          ///< relaunches: of the whole job (--relaunch all), or of dead ranks
};

/// Starts every rank of `plan` (each in a process group of its own, stdin from /dev/null, stdout
/// and stderr on pipes, killed with SIGKILL if the launcher dies) and supervises them until all
/// have ended: prefixes their lines, forwards the signals read from io.interrupt_fd, and when one
/// rank fails (non-zero status or a signal) sends SIGTERM to the others, then SIGKILL to those
/// still running plan.grace_seconds later. The first forwarded signal asks for a graceful stop and
/// waits however long it takes (a rank exiting 128 + that signal, or killed by it, stops no other);
/// a second one starts the grace period. With plan.relaunches > 0 a failed rank is instead
/// started again in its place (its environment also holding ACTORPIPE_RESTART, the count of
/// relaunches so far, ACTORPIPE_MAX_RESTARTS and ACTORPIPE_RESTART_REASON) after
/// plan.relaunch_backoff seconds, doubled for each further relaunch, at most 60, while the others
/// go on, as long as relaunches remain, no rank has finished, no stop was asked and the rank did
/// not exit with kExitNoRestart. Returns once every rank has been reaped.
LaunchResult run_launch(const LaunchPlan& plan, const LaunchIo& io);

/// The whole job, restarted after failures up to options.max_restarts times (0: run once).
/// --relaunch dead (options.relaunch_dead): one plan, every rank's environment also holding
/// ACTORPIPE_REJOIN=K (a rank whose part of the run fails while it lives on rejoins the job: the
/// example trainers do), and each dead rank relaunched in place by run_launch (plan.relaunches).
/// --relaunch all: when the job failed, waits options.restart_backoff seconds (doubled for each
/// further restart, at most 60; ended early by `stop`), says so on io.message and starts every
/// rank again from a fresh plan (a new port unless --port, a new secret), their environment
/// also holding ACTORPIPE_RESTART (1 for the first relaunch), ACTORPIPE_MAX_RESTARTS and
/// ACTORPIPE_RESTART_REASON (the failure, e.g. "rank 1 killed by signal 9 (SIGKILL)"). Either
/// way a trainer resumes from its checkpoint directory (docs/failures.md). With restarts, each
/// rank's environment also names its failure record, ACTORPIPE_FAILURE_FILE (a file of its own
/// in a directory the launcher makes and removes with the job): a rank ending with a failure of
/// its own writes it there, and the process started in its place finds it (the example
/// trainers: the same failure again at no later step ends it with kExitNoRestart). No relaunch
/// after a forwarded signal (`stop` requested), a rank that could not start (127), a rank that
/// exited with kExitNoRestart or a plan that failed (1).
LaunchResult run_job(const LaunchOptions& options, const std::string& program,
                     const std::vector<std::string>& base_env, const LaunchIo& io,
                     const StopFlag* stop = nullptr);

}  // namespace actorpipe
