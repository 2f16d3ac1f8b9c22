// Cluster environment: how one process of a job learns its rank, the world size, the coordinator's
// address and where its job secret is, from explicit flags or from the variables its launcher set.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "engine/expected.hpp"

namespace actorpipe {

/// The variables actorpipe-launch sets in every rank's environment (and that a user may set by
/// hand under any other launcher).
namespace cluster_vars {
inline constexpr const char* rank = "ACTORPIPE_RANK";                ///< 0 .. world-1
inline constexpr const char* world = "ACTORPIPE_WORLD";              ///< number of processes
inline constexpr const char* coordinator = "ACTORPIPE_COORDINATOR";  ///< host:port of rank 0
inline constexpr const char* job_secret = "ACTORPIPE_JOB_SECRET";    ///< the secret itself
inline constexpr const char* job_secret_file = "ACTORPIPE_JOB_SECRET_FILE";  ///< a file holding it
/// Under --max-restarts: where the rank leaves its last own failure for the process that
/// replaces it (transport/failure_record.hpp); one file per rank, removed with the job.
inline constexpr const char* failure_file = "ACTORPIPE_FAILURE_FILE";
}  // namespace cluster_vars

/// The exit status by which a rank tells its launcher that starting it again cannot help (the
/// example trainers: the same failure again without a step of progress, docs/launch.md):
/// actorpipe-launch then neither relaunches it nor restarts the job, whatever --max-restarts
/// allows.
inline constexpr int kExitNoRestart = 3;

/// The largest world size accepted.
inline constexpr int kMaxWorld = 1000000;

/// Where rank and world came from, in precedence order after the flags.
enum class ClusterSource {
  single,            ///< nothing set: one process, rank 0 of 1
  flags,             ///< --rank and --world, no launcher variables
  actorpipe_launch,  ///< ACTORPIPE_RANK, ACTORPIPE_WORLD
  open_mpi,          ///< OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE (Open MPI's mpirun)
  mpich,             ///< PMI_RANK, PMI_SIZE (MPICH/Hydra mpiexec, Intel MPI)
  torchrun,          ///< RANK, WORLD_SIZE (torchrun / torch.distributed.run)
  slurm,             ///< SLURM_PROCID, SLURM_NTASKS (srun)
};

/// "Open MPI (mpirun)", "Slurm (srun)", ...
const char* to_string(ClusterSource source);

/// Where the coordinator address came from.
enum class CoordinatorSource {
  none,      ///< a single-process job: no coordinator needed, none given
  flag,      ///< --coordinator
  variable,  ///< ACTORPIPE_COORDINATOR
  torchrun,  ///< MASTER_ADDR and MASTER_PORT
  slurm,     ///< the first host of the Slurm node list, ClusterDefaults::port
  defaults,  ///< rank 0's default: ClusterDefaults::host and ClusterDefaults::port
};

/// Where the job secret is read from. Never from the command line (other users see it there).
struct JobSecretSource {
  enum class Kind { none, variable, file };
  Kind kind = Kind::none;
  std::string path;  ///< Kind::file: the file ACTORPIPE_JOB_SECRET_FILE names
};

/// The explicit command-line values, as text; absent when the flag was not given.
struct ClusterFlags {
  std::optional<std::string> rank;         ///< --rank
  std::optional<std::string> world;        ///< --world
  std::optional<std::string> coordinator;  ///< --coordinator host:port
};

/// What rank 0 of a multi-process job uses when nothing names a coordinator, and the port of a
/// Slurm job's coordinator (Slurm names hosts, not ports). Comes from the config.
struct ClusterDefaults {
  std::string host = "127.0.0.1";
  int port = 0;  ///< 0: no default port; a multi-process job must then be given an address
};

/// Where this process stands in its job.
struct ClusterEnv {
  int rank = 0;
  int world = 1;
  std::string coordinator_host = "127.0.0.1";
  int coordinator_port = 0;  ///< 0 only when coordinator_source is none
  ClusterSource source = ClusterSource::single;
  CoordinatorSource coordinator_source = CoordinatorSource::none;
  JobSecretSource secret;

  bool multi_process() const { return world > 1; }
  /// "host:port", "[v6-address]:port" for an IPv6 address.
  std::string coordinator() const;
  /// One line for logs: "rank 1 of 4 (Open MPI (mpirun)), coordinator node01:29400".
  std::string describe() const;
};

/// Reads one environment variable: its value, or nullptr when it is not set.
using EnvLookup = std::function<const char*(const char*)>;

/// The process's own environment (std::getenv).
EnvLookup process_environment();

/// An environment made of `vars` only (tests, and programs that build a child's environment).
EnvLookup environment_from(std::map<std::string, std::string> vars);

/// Determines rank, world, coordinator and the secret's source. Precedence:
///   1. the flags (--rank, --world, --coordinator);
///   2. the first launcher whose variables are set, in this order: actorpipe-launch
///      (ACTORPIPE_RANK/ACTORPIPE_WORLD), Open MPI (OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE),
///      MPICH/Hydra (PMI_RANK/PMI_SIZE), torchrun (RANK/WORLD_SIZE), Slurm
///      (SLURM_PROCID/SLURM_NTASKS): the innermost launcher first, Slurm (the allocation, which
///      others run inside) last;
///   3. nothing set: one process, rank 0 of 1.
/// A --rank or --world that disagrees with the launcher's value is an error, as is a rank outside
/// [0, world). The coordinator is --coordinator, else ACTORPIPE_COORDINATOR, else the launcher's
/// (torchrun: MASTER_ADDR:MASTER_PORT, or MASTER_PORT + 1 when TORCHELASTIC_USE_AGENT_STORE is
/// "True" because torchrun's own store listens there; Slurm: the first node of SLURM_STEP_NODELIST,
/// SLURM_JOB_NODELIST or SLURM_NODELIST with `defaults.port`), else for rank 0 only
/// `defaults.host:defaults.port`. A multi-process job without one is an error. Empty variables
/// count as unset. Reads nothing but `env`.
Expected<ClusterEnv> resolve_cluster_env(const ClusterFlags& flags, const EnvLookup& env,
                                         const ClusterDefaults& defaults = {});

/// Reads the job secret from where `cluster.secret` says: ACTORPIPE_JOB_SECRET, or the file
/// ACTORPIPE_JOB_SECRET_FILE names, which must be a regular file that neither group nor others
/// may access (mode & 0077 == 0). A secret has 16 to 4096 printable ASCII characters, no spaces;
/// a file's trailing white space is dropped. A single-process job without a secret gets "";
/// a multi-process job without one is an error. Messages never show the secret.
Expected<std::string> load_job_secret(const ClusterEnv& cluster, const EnvLookup& env);

/// The first host of a Slurm node list in its compressed form: "node[01-04,07],gpu5" -> "node01",
/// "rack[2-3]-n[5,9]" -> "rack2-n5". `what` names the input in errors.
Expected<std::string> slurm_first_host(std::string_view what, std::string_view nodelist);

/// A host and a TCP port.
struct HostPort {
  std::string host;
  int port = 0;
};

/// Parses "host:port" or "[v6-address]:port" (port 1 to 65535). `what` names the input in errors
/// ("--coordinator", "ACTORPIPE_COORDINATOR").
Expected<HostPort> parse_host_port(std::string_view what, std::string_view text);

/// "host:port", or "[host]:port" when host contains ':'.
std::string format_host_port(std::string_view host, int port);

}  // namespace actorpipe
