// Actor exits: waits until actors have ended completely, every message about their end sent.
#pragma once

#include <caf/actor.hpp>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>

namespace actorpipe::internal {

/// Counts the ends of the actors it watches, and waits for them.
///
/// Why not a monitor: CAF runs an ending actor's attachables newest first, on the actor's own
/// thread, one after the other. A monitor set up to wait for the end is among the newest, so its
/// down message arrives while older ones have not been sent yet, among them the middleman's: its
/// BASP broker monitors every local actor that another process holds a proxy of. An actor system
/// torn down right after that down message can stop the middleman before the broker's message is
/// in the broker's mailbox; that message, which holds a reference to the ended actor, is then
/// never delivered nor destroyed, so the actor is never destroyed and the system's destructor
/// waits for its thread forever.
///
/// watch() attaches a functor right after the spawn, before anything else can monitor or link
/// the actor: it is the oldest attachable, so it runs last, when every other message about the
/// end is in its receiver's mailbox. Thread-safe.
class ActorExits {
 public:
  ActorExits();

  /// Counts `a`'s end once it has ended. Call it before `a`'s handle is given to anyone else
  /// (an actor that has ended already counts at once).
  void watch(const caf::actor& a);

  /// Returns once every watched actor has ended.
  void wait();

  /// Actors watched and actors that have ended so far.
  size_t watched() const;
  size_t ended() const;

 private:
  struct Shared {
    mutable std::mutex mu;
    std::condition_variable cv;
    size_t ended = 0;
  };
  std::shared_ptr<Shared> shared_;  // the functors keep it while an actor outlives this object
  size_t watched_ = 0;
};

}  // namespace actorpipe::internal
