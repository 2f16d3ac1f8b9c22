#include "kernels/bf16_weights.hpp"

#include "kernels/check.hpp"

namespace actorpipe {

void Bf16Weights::cover(const float* p, size_t n) {
  if (n > 0) ranges_.emplace_back(p, n);
}

void Bf16Weights::sync(uint64_t generation) {
  if (synced_ && generation == generation_) return;
  generation_ = generation;
  synced_ = true;
  for (auto& [w, e] : entries_) e.generation = ~uint64_t{0};  // stale: made before the change
}

bool Bf16Weights::covered(const float* w, int64_t n) const {
  for (const auto& [p, size] : ranges_)
    if (w >= p && w + n <= p + size) return true;
  return false;
}

const bf16* Bf16Weights::copy(Context& ctx, const float* w, int64_t n) {
  if (source_) {
    if (const bf16* kept = source_(w, n); kept != nullptr) return kept;
  }
  if (!synced_ || !covered(w, n)) {
    bf16* d = alloc_bf16(ctx, n);
    convert_to_bf16(ctx, w, d, n);
    return d;
  }
  Entry& e = entries_[w];
  if (e.n != n) {
    e.data = std::make_unique<bf16[]>(static_cast<size_t>(n));
    e.n = n;
    e.generation = ~uint64_t{0};
  }
  if (e.generation != generation_) {
    convert_to_bf16(ctx, w, e.data.get(), n);
    e.generation = generation_;
    ++made_;
  }
  return e.data.get();
}

bf16* Bf16Weights::reserve(const float* w, int64_t n) {
  AP_CHECK(n > 0 && covered(w, n), "Bf16Weights::reserve: [{}, +{}) is not in a covered range",
           static_cast<const void*>(w), n);
  Entry& e = entries_[w];
  if (e.n != n) {
    e.data = std::make_unique<bf16[]>(static_cast<size_t>(n));
    e.n = n;
    e.generation = ~uint64_t{0};
  }
  return e.data.get();
}

void Bf16Weights::mark_current(const float* w) {
  const auto it = entries_.find(w);
  AP_CHECK(it != entries_.end() && synced_,
           "Bf16Weights::mark_current: no array reserved for {} (or never synced)",
           static_cast<const void*>(w));
  it->second.generation = generation_;
  ++marked_;
}

size_t Bf16Weights::bytes() const {
  size_t b = 0;
  for (const auto& [w, e] : entries_) b += static_cast<size_t>(e.n) * sizeof(bf16);
  return b;
}

}  // namespace actorpipe
