// Job coordinator: rank 0 publishes it through CAF's middleman; every rank joins it with the job
// secret and what it announces (RankInfo) and gets back the same JobTable once all ranks are in.
#pragma once

#include <caf/actor.hpp>
#include <caf/error.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/load_callback.hpp>
#include <caf/meta/type_name.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/expected.hpp"

namespace actorpipe {

/// What one rank announces when it joins the job.
struct RankInfo {
  int rank = -1;
  std::string host;                     ///< where the rank runs (for messages and peers)
  std::vector<char> transport_address;  ///< opaque bytes, e.g. a UCX worker address
  std::vector<caf::actor> actors;       ///< its local actors; actors[0] is watched for failures

  friend bool operator==(const RankInfo&, const RankInfo&) = default;
};

/// The job as every rank sees it once all `world` ranks have joined.
struct JobTable {
  int world = 0;
  std::vector<RankInfo> ranks;  ///< by rank: ranks[r].rank == r
  caf::actor coordinator;       ///< relays rank losses to the watchers (watch_ranks)

  friend bool operator==(const JobTable&, const JobTable&) = default;
};

/// Serialisation, printing and debugging of a RankInfo (crosses processes in `join`). The
/// address travels as a string, the same bytes on the wire as the vector: CAF 0.17 sizes a
/// std::vector<char> it reads by the length the sender claims before it checks that so many
/// bytes arrived (a 4 GiB allocation for a few bytes of a stranger's join); a string's length is
/// checked first.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RankInfo& x) {
  std::string address(x.transport_address.begin(), x.transport_address.end());
  return f(caf::meta::type_name("actorpipe::RankInfo"), x.rank, x.host, address,
           caf::meta::load_callback([&]() -> caf::error {
             x.transport_address.assign(address.begin(), address.end());
             return caf::none;
           }),
           x.actors);
}

/// Serialisation, printing and debugging of a JobTable (the answer to `join`).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JobTable& x) {
  return f(caf::meta::type_name("actorpipe::JobTable"), x.world, x.ranks, x.coordinator);
}

/// Registers the coordinator's message types (RankInfo, JobTable) and its error category with
/// `cfg`. Every rank calls it before creating its actor system; a type one side lacks arrives as
/// an empty message and the join is refused.
void add_coordinator_types(caf::actor_system_config& cfg);

/// Where a TLS node finds its credentials (PEM files).
struct TlsFiles {
  std::string certificate;  ///< this node's certificate (chain)
  std::string key;          ///< its private key (unencrypted)
  std::string ca_file;      ///< the CA certificates a peer's certificate must chain to
};

/// Loads CAF's OpenSSL module into `cfg` with `files` as this node's credentials: every TLS
/// connection then requires a certificate from both sides that chains to `ca_file`. CAF reads
/// the files from the actor system's config, so this runs before the actor system is created,
/// after cfg.load<caf::io::middleman>(). The files are checked here (readable, PEM, key matches
/// the certificate): CAF itself would throw from its network thread on a bad file.
Status enable_tls(caf::actor_system_config& cfg, const TlsFiles& files);

/// How rank 0 runs the coordinator.
struct CoordinatorOptions {
  int world = 1;                           ///< ranks in the job, 0..world-1
  std::string secret;                      ///< job secret every join must present (not empty)
  std::string bind_address = "127.0.0.1";  ///< address the port listens on (loopback default)
  uint16_t port = 0;                       ///< 0: an ephemeral port (returned)
  std::chrono::milliseconds join_timeout{60000};  ///< from publishing until all ranks are in
  bool tls = false;  ///< publish over TLS (the actor system must have been built with enable_tls)
};

/// The published coordinator; stops it (closes the port, ends the actor) when destroyed.
class Coordinator {
 public:
  Coordinator(caf::actor_system& sys, caf::actor actor, uint16_t port);
  Coordinator(Coordinator&& other) noexcept;
  Coordinator& operator=(Coordinator&& other) noexcept;
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;
  ~Coordinator();

  uint16_t port() const { return port_; }             ///< the port it listens on
  const caf::actor& actor() const { return actor_; }  ///< the coordinator actor
  /// Closes the port and ends the actor (pending joins get an error); waits until it has ended.
  void stop();

 private:
  caf::actor_system* sys_ = nullptr;
  caf::actor actor_;
  uint16_t port_ = 0;
};

/// Rank 0: spawns the coordinator and publishes it on options.bind_address:options.port. It
/// answers every `join` once all `world` ranks have joined, all with the same JobTable. Refused
/// (error reply, one line on stderr naming the peer's node id), while the job goes on: a wrong or
/// missing secret, a rank outside [0, world), a rank or a node that already joined, a rank that
/// announces no actor, and any other message from a node that has not joined with the secret.
/// A rank whose actors[0] goes down before every rank is in leaves its place (and its node's) open
/// for a new process. If not all ranks are in within join_timeout, the pending joins get an error
/// naming the missing ranks, and so does every later join. Once complete, it watches every rank
/// and relays each loss to the watchers of watch_ranks.
Expected<Coordinator> publish_coordinator(caf::actor_system& sys, CoordinatorOptions options);

/// How a rank reaches the coordinator.
struct JoinOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string secret;
  std::chrono::milliseconds timeout{60000};  ///< connecting, joining and waiting for the table
  bool tls = false;  ///< connect over TLS (the actor system must have been built with enable_tls)
  /// This process rejoins a job after a failure (its own earlier process group, or its
  /// predecessor's, may still be ending): a coordinator that refuses because its job is complete
  /// or closed, or that goes away while the join waits, is taken for the previous job's, and the
  /// join tries again until the timeout (the new job's coordinator publishes on the same port).
  bool rejoin = false;
};

/// Any rank (rank 0 included): connects to the coordinator, retrying refused connections with
/// backoff (rank 0 may publish later), joins with `self`, and waits for the JobTable. Errors name
/// the coordinator's address, how long and how often it tried, and the coordinator's refusal.
Expected<JobTable> join_coordinator(caf::actor_system& sys, const JoinOptions& options,
                                    RankInfo self);

/// Called once per lost rank with the rank and the reason (CAF's error, rendered).
using RankLostHandler = std::function<void(int rank, const std::string& reason)>;

/// Watches the other ranks of a job (see watch_ranks); stops watching when destroyed.
class RankWatch {
 public:
  RankWatch(caf::actor_system& sys, caf::actor watcher);
  RankWatch(RankWatch&& other) noexcept;
  RankWatch& operator=(RankWatch&& other) noexcept;
  RankWatch(const RankWatch&) = delete;
  RankWatch& operator=(const RankWatch&) = delete;
  ~RankWatch();

  const caf::actor& actor() const { return watcher_; }
  /// Ends the watcher and waits until it has: the handler is not called after stop() returns.
  void stop();

 private:
  caf::actor_system* sys_ = nullptr;
  caf::actor watcher_;
};

/// Failure detection: spawns an actor on `sys` that monitors actors[0] of every rank of `table`
/// other than `self_rank` and calls on_lost(rank, reason) once per rank whose actor goes down
/// (a killed process: remote_link_unreachable). It also subscribes to the coordinator, which
/// watches every rank over a direct connection and relays each loss: CAF 0.17 tells a node
/// nothing when a process it reaches only through rank 0 dies. on_lost runs on the watcher's
/// thread. Stop the watcher before the watched actors end normally at the end of a job.
Expected<RankWatch> watch_ranks(caf::actor_system& sys, const JobTable& table, int self_rank,
                                RankLostHandler on_lost);

}  // namespace actorpipe
