// Scratch pool: smallest fit over the kept buffers of the memory asked for.
#include "engine/execution/scratch_pool.hpp"

namespace actorpipe {

void ScratchPool::give(BackendBuffer buffer) {
  const size_t floats = buffer.size();
  if (floats == 0) return;
  kept_bytes_ += floats * sizeof(float);
  const BackendMemory* memory = buffer.memory();
  kept_.emplace(std::make_pair(memory, floats), std::move(buffer));
}

BackendBuffer ScratchPool::take(BackendMemory& memory, size_t n) {
  if (n == 0) return {};
  auto it = kept_.lower_bound({&memory, n});
  if (it == kept_.end() || it->first.first != &memory) {
    allocated_bytes_ += n * sizeof(float);
    return BackendBuffer(memory, n);
  }
  BackendBuffer out = std::move(it->second);
  kept_.erase(it);
  const size_t bytes = out.size() * sizeof(float);
  kept_bytes_ -= bytes;
  reused_bytes_ += bytes;
  memory.fill_zero(out.data(), static_cast<long>(n));
  return out;
}

void assign_zeros(BackendBuffer& b, BackendMemory& memory, size_t n, ScratchPool* pool) {
  if (pool != nullptr) {
    b = pool->take(memory, n);
  } else if (b.memory() == &memory && b.size() >= n && n > 0) {
    memory.fill_zero(b.data(), static_cast<long>(n));
  } else {
    b = n > 0 ? BackendBuffer(memory, n) : BackendBuffer();
  }
}

}  // namespace actorpipe
