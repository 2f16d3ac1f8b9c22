// UCX shared arena: chunks from UcxWorker::map_shared, first-fit blocks with coalescing free
// lists, the heap when no chunk can be mapped.
#include "transport/ucx_shared_arena.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>

#include "kernels/check.hpp"

namespace actorpipe {

namespace {

constexpr size_t kAlign = 64;
constexpr size_t kChunkAlign = size_t{2} << 20;

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

}  // namespace

UcxSharedArena::UcxSharedArena(std::shared_ptr<UcxWorker> worker, UcxEndpoint peer,
                               std::string name, size_t chunk_bytes)
    : worker_(std::move(worker)),
      peer_(peer),
      name_(std::move(name)),
      chunk_bytes_(round_up(std::max(chunk_bytes, kChunkAlign), kChunkAlign)) {}

Expected<std::shared_ptr<UcxSharedArena>> UcxSharedArena::create(std::shared_ptr<UcxWorker> worker,
                                                                 UcxEndpoint peer, std::string name,
                                                                 size_t chunk_bytes) {
  AP_CHECK(worker != nullptr, "{}: no UCX worker", name);
  std::shared_ptr<UcxSharedArena> arena(
      new UcxSharedArena(std::move(worker), peer, std::move(name), chunk_bytes));
  auto first = arena->worker_->map_shared(arena->chunk_bytes_, peer);
  if (!first) return make_error("{}: {}", arena->name_, first.error().message);
  arena->add_chunk(std::move(*first));
  return arena;
}

UcxSharedArena::~UcxSharedArena() {
  for (const Chunk& c : chunks_) worker_->unmap_shared(c.region.id);
}

void UcxSharedArena::add_chunk(UcxSharedRegion region) {
  Chunk c;
  c.region = std::move(region);
  c.free.emplace(0, c.region.length);  // all of it free
  chunks_.push_back(std::move(c));
}

std::byte* UcxSharedArena::carve(size_t bytes) {
  for (Chunk& c : chunks_) {
    for (auto it = c.free.begin(); it != c.free.end(); ++it) {
      if (it->second < bytes) continue;
      const size_t offset = it->first;
      const size_t left = it->second - bytes;
      c.free.erase(it);
      if (left > 0) c.free.emplace(offset + bytes, left);
      return c.region.address + offset;
    }
  }
  return nullptr;
}

float* UcxSharedArena::allocate(size_t n) {
  const size_t bytes = round_up(std::max<size_t>(n, 1) * sizeof(float), kAlign);
  std::unique_lock<std::mutex> lock(mu_);
  void* p = carve(bytes);
  while (p == nullptr && !chunk_failed_) {
    // a new chunk, mapped without the lock: the progress thread that maps it may be releasing
    // a block of this arena meanwhile (a completion dropping a tensor)
    lock.unlock();
    auto more = worker_->map_shared(std::max(chunk_bytes_, round_up(bytes, kChunkAlign)), peer_);
    lock.lock();
    if (!more) {
      chunk_failed_ = true;  // the heap from now on: those tensors are sent by copy
      break;
    }
    add_chunk(std::move(*more));
    p = carve(bytes);
  }
  if (p != nullptr) {
    used_.emplace(static_cast<const std::byte*>(p), bytes);
  } else {
    p = std::aligned_alloc(kAlign, bytes);
    AP_CHECK(p != nullptr, "{}: out of memory allocating {} bytes", name_, bytes);
    heap_.insert(p);
  }
  std::memset(p, 0, bytes);
  if (!self_) self_ = shared_from_this();
  return static_cast<float*>(p);
}

void UcxSharedArena::release(float* p) {
  if (p == nullptr) return;
  std::shared_ptr<UcxSharedArena> last;  // the arena may go with its last block: after the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (heap_.erase(p) > 0) {
      std::free(p);
    } else {
      const auto* b = reinterpret_cast<const std::byte*>(p);
      auto it = used_.find(b);
      AP_CHECK(it != used_.end(), "{}: releasing {} which it did not allocate", name_,
               static_cast<void*>(p));
      size_t offset = 0;
      size_t bytes = it->second;
      Chunk* owner = nullptr;
      for (Chunk& c : chunks_) {
        if (b >= c.region.address && b < c.region.address + c.region.length) {
          owner = &c;
          offset = static_cast<size_t>(b - c.region.address);
          break;
        }
      }
      AP_CHECK(owner != nullptr, "{}: block {} lies in no chunk", name_, static_cast<void*>(p));
      used_.erase(it);
      // coalesce with the free neighbours
      auto next = owner->free.lower_bound(offset);
      if (next != owner->free.end() && next->first == offset + bytes) {
        bytes += next->second;
        next = owner->free.erase(next);
      }
      if (next != owner->free.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == offset) {
          offset = prev->first;
          bytes += prev->second;
          owner->free.erase(prev);
        }
      }
      owner->free.emplace(offset, bytes);
    }
    if (used_.empty() && heap_.empty()) last = std::move(self_);
  }
}

void UcxSharedArena::to_backend(float* dst, const float* src, size_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

void UcxSharedArena::to_host(float* dst, const float* src, size_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

void UcxSharedArena::copy(float* dst, const float* src, size_t n) {
  std::memmove(dst, src, n * sizeof(float));
}

void UcxSharedArena::fill_zero(float* dst, long N) {
  if (N > 0) std::memset(dst, 0, static_cast<size_t>(N) * sizeof(float));
}

std::optional<UcxSharedPlace> UcxSharedArena::locate(const void* data, size_t bytes) const {
  const auto* b = static_cast<const std::byte*>(data);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const UcxSharedRegion& r = chunks_[i].region;
    if (b >= r.address && b < r.address + r.length &&
        bytes <= static_cast<size_t>(r.address + r.length - b))
      return UcxSharedPlace{static_cast<uint32_t>(i), static_cast<uint64_t>(b - r.address)};
  }
  return std::nullopt;
}

UcxSharedRegion UcxSharedArena::chunk(uint32_t i) const {
  std::lock_guard<std::mutex> lock(mu_);
  AP_CHECK(i < chunks_.size(), "{}: no chunk {} ({} mapped)", name_, i, chunks_.size());
  return chunks_[i].region;
}

size_t UcxSharedArena::chunks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return chunks_.size();
}

size_t UcxSharedArena::blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_.size() + heap_.size();
}

size_t UcxSharedArena::heap_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return heap_.size();
}

}  // namespace actorpipe
