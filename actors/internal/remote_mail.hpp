// Remote mail: the control messages of a run between actors of different processes (losses,
// credits, commits, microbatch releases, clip sums and scales, tied announcements) on the job's
// UCX workers (transport/ucx_messenger.hpp) instead of CAF's middleman, whose hop between two
// processes costs 100 µs or more and wakes a thread on each side. The messages are the same
// CAF messages, serialised by CAF with the types the engine registers; the receiving process
// hands each to the addressed actor as if CAF had delivered it.
#pragma once

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "actors/internal/run_state.hpp"
#include "engine/expected.hpp"
#include "transport/ucx_worker.hpp"

namespace actorpipe {
class UcxMessenger;
}

namespace actorpipe::internal {

/// An actor of a run by its role: the driver, stage r's actor or stage r's optimizer shard.
struct MailAddress {
  enum class Kind : uint8_t { driver, stage, shard };
  Kind kind = Kind::driver;
  int32_t index = 0;  ///< the stage (0 for the driver)

  static MailAddress driver() { return {Kind::driver, 0}; }
  static MailAddress stage(int r) { return {Kind::stage, r}; }
  static MailAddress shard(int r) { return {Kind::shard, r}; }
  friend bool operator==(const MailAddress&, const MailAddress&) = default;
};

/// The process `to` runs in.
int rank_of(const RunState& st, MailAddress to);
/// The directory's handle of `to`.
const caf::actor& actor_at(const RunState& st, MailAddress to);

/// One process's end of a run's remote mail.
class RemoteMail {
 public:
  /// Starts receiving on `stream` (every process of the job must use the same, and a stream
  /// no earlier run of the job used) from every peer of `peers` (rank -> endpoint) and
  /// delivers to this process's actors of `st`'s directory, which must be complete; a message
  /// that cannot be read or delivered fails the run (a Failure to the driver through CAF).
  /// Errors: those of UcxMessenger::create.
  static Expected<std::unique_ptr<RemoteMail>> create(caf::actor_system& sys, const RunState& st,
                                                      std::shared_ptr<UcxWorker> worker, int rank,
                                                      const std::map<int, UcxEndpoint>& peers,
                                                      uint32_t stream);
  /// Stops delivering (a delivery running now finishes first).
  ~RemoteMail();
  RemoteMail(const RemoteMail&) = delete;
  RemoteMail& operator=(const RemoteMail&) = delete;

  /// Sends `msg` to the actor at `to`, which runs in process `rank`. False when it cannot go
  /// this way (longer than the messenger takes, or an earlier send to that rank failed): the
  /// caller then sends it through CAF.
  bool send(int rank, MailAddress to, const caf::message& msg);

  /// Messages delivered to this process's actors so far.
  uint64_t delivered() const;

 private:
  RemoteMail(caf::actor_system& sys, caf::actor driver);
  void deliver(int from, std::span<const std::byte> bytes);
  void fail(const std::string& cause);

  caf::actor_system& sys_;
  caf::actor driver_;  // where a failure goes (possibly in another process)
  std::map<std::pair<int, int32_t>, caf::actor> local_;  // (kind, index) -> this process's actor
  std::unique_ptr<UcxMessenger> messenger_;
};

/// Sends `xs` from `self` to the actor at `to`: on the run's remote mail when `to` runs in
/// another process and the mail takes it, else through CAF (in-process, or the middleman).
/// Messages from one actor to another keep their order either way, as long as each pair's
/// messages all take one path; those that only CAF can carry (requests, failures) may pass
/// them.
template <class... Ts>
void send_to(caf::event_based_actor* self, const RunState& st, MailAddress to, Ts&&... xs) {
  if (st.mail != nullptr) {
    const int rank = rank_of(st, to);
    if (rank != st.rank && st.mail->send(rank, to, caf::make_message(xs...))) return;
  }
  self->send(actor_at(st, to), std::forward<Ts>(xs)...);
}

}  // namespace actorpipe::internal
