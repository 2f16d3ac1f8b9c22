// UCX shared arena: host memory that a sending process allocates its outgoing tensors in, so
// that a receiving process on the same host reads them in place (no copy on either side).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "kernels/backend_memory.hpp"
#include "transport/ucx_worker.hpp"

namespace actorpipe {

/// Where a block of a UcxSharedArena lies: its chunk and the byte offset in it.
struct UcxSharedPlace {
  uint32_t chunk = 0;
  uint64_t offset = 0;
};

/// A BackendMemory in host memory that UCX allocated to share (UcxWorker::map_shared) with the
/// peer of one endpoint: chunks of at least chunk_bytes, each mapped once, carved first-fit into
/// 64-byte aligned blocks. allocate() zero-fills as every BackendMemory does. When a new chunk
/// cannot be mapped (the peer cannot map it, UCX is out of shared memory), the block comes from
/// the heap instead and locate() says so: such a tensor is sent by copy.
///
/// Lifetime: a storage in the arena keeps it alive (the arena holds itself while it has blocks
/// out), and the arena keeps its worker alive, so no block outlives its memory. Thread-safe.
class UcxSharedArena final : public BackendMemory,
                             public std::enable_shared_from_this<UcxSharedArena> {
 public:
  /// Chunks are at least this large (tensors of the small GPT are 3 MiB; a few per chunk).
  static constexpr size_t kDefaultChunkBytes = size_t{16} << 20;

  /// An arena whose memory the peer of `peer` can map; its first chunk is mapped now, which
  /// checks that. Errors: the peer cannot map memory of this process (another host, transports
  /// without shared memory), a UCX failure; each names `name`.
  static Expected<std::shared_ptr<UcxSharedArena>> create(std::shared_ptr<UcxWorker> worker,
                                                          UcxEndpoint peer, std::string name,
                                                          size_t chunk_bytes = kDefaultChunkBytes);
  ~UcxSharedArena() override;

  Device device() const override { return Device::cpu; }
  std::string name() const override { return name_; }
  float* allocate(size_t n) override;
  void release(float* p) override;
  void to_backend(float* dst, const float* src, size_t n) override;
  void to_host(float* dst, const float* src, size_t n) override;
  void copy(float* dst, const float* src, size_t n) override;
  void fill_zero(float* dst, long N) override;
  void synchronize() override {}
  /// The arena itself: it outlives every block it hands out.
  BackendMemory& lasting_memory() override { return *this; }

  /// Where `bytes` at `data` lie in a chunk; nullopt when not wholly inside one (a heap block,
  /// memory of another owner).
  std::optional<UcxSharedPlace> locate(const void* data, size_t bytes) const;
  /// Chunk `i`'s region (address, length, packed key). AP_CHECK on an unknown chunk.
  UcxSharedRegion chunk(uint32_t i) const;
  size_t chunks() const;
  /// Blocks handed out and not released; of those, the ones on the heap.
  size_t blocks() const;
  size_t heap_blocks() const;

 private:
  UcxSharedArena(std::shared_ptr<UcxWorker> worker, UcxEndpoint peer, std::string name,
                 size_t chunk_bytes);
  /// A block of `bytes` (a multiple of 64) in a chunk mapped already; null when none has room.
  /// Under mu_.
  std::byte* carve(size_t bytes);
  /// A chunk just mapped, all of it free. Under mu_ (or before the arena is shared).
  void add_chunk(UcxSharedRegion region);

  struct Chunk {
    UcxSharedRegion region;
    std::map<size_t, size_t> free;  // offset -> bytes, coalesced
  };
  std::shared_ptr<UcxWorker> worker_;
  UcxEndpoint peer_;
  std::string name_;
  size_t chunk_bytes_;
  mutable std::mutex mu_;
  std::vector<Chunk> chunks_;
  std::map<const std::byte*, size_t> used_;  // block -> bytes, in chunks
  std::set<void*> heap_;                     // blocks on the heap
  bool chunk_failed_ = false;                // a chunk could not be mapped: the heap from now on
  std::shared_ptr<UcxSharedArena> self_;     // while blocks are out
};

}  // namespace actorpipe
