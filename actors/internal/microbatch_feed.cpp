// Microbatch feed: the microbatches of a run as the stages of one process take them, read once
// from the process's own data loader in order and shared by its stages (the driver sends indices).
#include "actors/internal/microbatch_feed.hpp"

#include <exception>

#include "engine/data/loader.hpp"

namespace actorpipe::internal {

MicrobatchFeed::MicrobatchFeed(DataLoader& data, int B, int T, int consumers, ReplicaSplit split,
                               int replica)
    : data_(data),
      B_(B),
      T_(T),
      consumers_(consumers),
      split_(split),
      replica_(replica),
      start_(data.position()) {}

Expected<MicrobatchPtr> MicrobatchFeed::take(int64_t mb) {
  std::lock_guard<std::mutex> lock(mu_);
  if (mb < 0) return make_error("microbatch {} requested, expected >= 0", mb);
  while (next_ <= mb) {
    std::shared_ptr<Microbatch> m;
    if (split_.replicas > 1)
      data_.seek(start_ + static_cast<uint64_t>(split_.global_index(replica_, next_)));
    const uint64_t position = data_.position();
    try {
      m = std::make_shared<Microbatch>(data_.next());
    } catch (const std::exception& e) {
      return make_error("the data loader failed at data position {}: {}", position, e.what());
    }
    if (m->B != B_ || m->T != T_) {
      return make_error("the data loader gave a ({}, {}) microbatch, expected ({}, {})", m->B, m->T,
                        B_, T_);
    }
    held_.emplace(next_++, Entry{std::move(m), 0});
  }
  auto it = held_.find(mb);
  if (it == held_.end())
    return make_error("microbatch {} was already taken by all {} stages", mb, consumers_);
  MicrobatchPtr p = it->second.mb;
  if (++it->second.taken == consumers_) held_.erase(it);
  return p;
}

int64_t MicrobatchFeed::read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_;
}

}  // namespace actorpipe::internal
