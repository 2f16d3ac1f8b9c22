// Process group: one process's place in a multi-process job — its rank, the CAF actor system
// with the middleman, the UCX worker and endpoints to every peer, admission through rank 0's
// coordinator, failure detection, and the all-gather the engine agrees on each run with.
#pragma once

#include <caf/actor.hpp>
#include <caf/meta/type_name.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "transport/ucx_worker.hpp"

namespace caf {
class actor_system;
}  // namespace caf

namespace actorpipe {

/// How one process joins its job (rank, world, coordinator and secret come from the launcher:
/// transport/cluster_env.hpp; the rest from the config's [cluster] section).
struct ProcessGroupOptions {
  int rank = 0;
  int world = 1;
  std::string coordinator_host = "127.0.0.1";  ///< where rank 0's coordinator listens
  int coordinator_port = 0;                    ///< rank 0 publishes here (0: any free port)
  std::string secret;                          ///< the job secret every rank presents
  std::string bind = "127.0.0.1";              ///< rank 0: the address the coordinator binds
  /// Joining, and each agreement between the ranks (run start and end), may take this long.
  std::chrono::milliseconds connect_timeout{60000};
  /// A lost peer stops this process's part of a run within this bound.
  std::chrono::milliseconds peer_timeout{10000};
  /// TLS for every control connection (all three PEM files, or none: plain TCP).
  std::string tls_certificate, tls_key, tls_ca;
  int scheduler_threads = 1;  ///< threads of the CAF scheduler (the driver, the agent)
  /// This process rejoins the job after a failure (JoinOptions::rejoin): a join the previous
  /// job's coordinator refuses is tried again until connect_timeout.
  bool rejoin = false;
  UcxWorkerOptions ucx;
};

/// One rank's part of an all-gather: handles of its actors and a small text.
struct RankPart {
  int rank = 0;
  std::vector<caf::actor> actors;
  std::string text;
};

/// Serialisation, printing and debugging of a RankPart (crosses processes in every all-gather).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RankPart& x) {
  return f(caf::meta::type_name("actorpipe::RankPart"), x.rank, x.actors, x.text);
}

/// A process of a job. Creating it joins the job: rank 0 publishes the coordinator, every rank
/// joins it with the secret and its UCX worker address, gets the job table, connects a UCX
/// endpoint to every other rank and starts watching them. Destroying it leaves the job.
class ProcessGroup {
 public:
  /// Errors: the coordinator cannot be published or reached within connect_timeout, the secret
  /// is refused, a UCX failure; each names the rank, the address and the cause.
  static Expected<std::unique_ptr<ProcessGroup>> create(const ProcessGroupOptions& options);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int world() const;
  const ProcessGroupOptions& options() const;
  /// The actor system every actor of this process runs in (middleman loaded).
  caf::actor_system& system();
  const std::shared_ptr<UcxWorker>& ucx() const;
  /// rank -> UCX endpoint, for every other rank.
  const std::map<int, UcxEndpoint>& peers() const;
  /// The port rank 0's coordinator listens on (rank 0 only; 0 elsewhere).
  int coordinator_port() const;

  /// Every rank contributes `mine` (its rank is filled in) and gets all parts, by rank, once
  /// every rank has contributed to the same round (rounds are counted: every rank calls
  /// all_gather equally often). Errors: a rank lost meanwhile, or not all in within
  /// connect_timeout.
  Expected<std::vector<RankPart>> all_gather(RankPart mine);

  /// Leaves the job together with the others after a successful end: waits until every rank
  /// has called it, stops watching for lost ranks (rank 0 also stops the coordinator), waits
  /// again, so no rank's end is taken for a loss. Without it (an error path) the other ranks
  /// see this process as lost when it exits. Errors: a rank lost meanwhile, or a timeout.
  Status leave();

  /// The first rank lost ("rank 2: remote_link_unreachable"), if any.
  std::optional<std::string> lost() const;
  /// Called once, on a CAF thread, when a rank is lost (the engine stops its local actors).
  /// Replaces the previous handler; an empty function removes it.
  void on_lost(std::function<void(int rank, const std::string& reason)> handler);

  struct Impl;

 private:
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace actorpipe
