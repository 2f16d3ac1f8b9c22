// Actor exits: a functor attached first to each actor counts its end (actor_exits.hpp).
#include "actors/internal/actor_exits.hpp"

#include <caf/abstract_actor.hpp>
#include <caf/actor_cast.hpp>

namespace actorpipe::internal {

ActorExits::ActorExits() : shared_(std::make_shared<Shared>()) {}

void ActorExits::watch(const caf::actor& a) {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    ++watched_;
  }
  caf::actor_cast<caf::abstract_actor*>(a)->attach_functor([s = shared_] {
    {
      std::lock_guard<std::mutex> lock(s->mu);
      ++s->ended;
    }
    s->cv.notify_all();
  });
}

void ActorExits::wait() {
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->cv.wait(lock, [&] { return shared_->ended >= watched_; });
}

size_t ActorExits::watched() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return watched_;
}

size_t ActorExits::ended() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->ended;
}

}  // namespace actorpipe::internal
