// Scratch pool: smallest fit over the kept buffers by capacity.
#include "engine/execution/scratch_pool.hpp"

#include <utility>

namespace actorpipe {

void ScratchPool::give(std::vector<float> buffer) {
  const size_t floats = buffer.capacity();
  if (floats == 0) return;
  kept_bytes_ += floats * sizeof(float);
  kept_.emplace(floats, std::move(buffer));
}

std::vector<float> ScratchPool::take(size_t n) {
  std::vector<float> out;
  if (n == 0) return out;
  auto it = kept_.lower_bound(n);
  if (it == kept_.end()) {
    out.assign(n, 0.0f);
    allocated_bytes_ += n * sizeof(float);
    return out;
  }
  out = std::move(it->second);
  kept_.erase(it);
  const size_t bytes = out.capacity() * sizeof(float);
  kept_bytes_ -= bytes;
  reused_bytes_ += bytes;
  out.assign(n, 0.0f);  // within the capacity: no allocation
  return out;
}

void assign_zeros(std::vector<float>& v, size_t n, ScratchPool* pool) {
  if (pool == nullptr) {
    v.assign(n, 0.0f);
  } else {
    v = pool->take(n);
  }
}

}  // namespace actorpipe
