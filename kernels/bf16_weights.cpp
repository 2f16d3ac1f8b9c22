#include "kernels/bf16_weights.hpp"

#include "kernels/check.hpp"

namespace actorpipe {

void Bf16Weights::cover(const float* p, size_t n) {
  if (n == 0) return;
  for (const Range& r : ranges_)
    AP_CHECK(p + n <= r.p || r.p + r.n <= p, "Bf16Weights::cover: [{}, +{}) overlaps [{}, +{})",
             static_cast<const void*>(p), n, static_cast<const void*>(r.p), r.n);
  ranges_.push_back({p, n});
}

void Bf16Weights::sync_range(Range& r, uint64_t generation) {
  if (r.synced && r.generation == generation) return;
  r.synced = true;
  r.generation = generation;
  r.epoch = ++epoch_;  // the copies made before are stale
}

void Bf16Weights::sync(const float* range, uint64_t generation) {
  for (Range& r : ranges_) {
    if (r.p != range) continue;
    sync_range(r, generation);
    return;
  }
  AP_CHECK(false, "Bf16Weights::sync: no covered range starts at {}",
           static_cast<const void*>(range));
}

void Bf16Weights::sync(uint64_t generation) {
  for (Range& r : ranges_) sync_range(r, generation);
}

int Bf16Weights::range_of(const float* w, int64_t n) const {
  for (size_t i = 0; i < ranges_.size(); ++i) {
    const Range& r = ranges_[i];
    if (w >= r.p && w + n <= r.p + r.n) return static_cast<int>(i);
  }
  return -1;
}

Bf16Weights::Entry& Bf16Weights::entry(const float* w, int64_t n, int range) {
  Entry& e = entries_[w];
  if (e.n != n || e.range != range) {
    e.data.assign(static_cast<size_t>(n), bf16{});
    e.n = n;
    e.range = range;
    e.epoch = 0;
  }
  return e;
}

const bf16* Bf16Weights::copy(Context& ctx, const float* w, int64_t n) {
  if (source_) {
    if (const bf16* kept = source_(w, n); kept != nullptr) return kept;
  }
  const int i = range_of(w, n);
  if (i < 0 || !ranges_[static_cast<size_t>(i)].synced) {
    bf16* d = alloc_bf16(ctx, n);
    convert_to_bf16(ctx, w, d, n);
    return d;
  }
  const uint64_t epoch = ranges_[static_cast<size_t>(i)].epoch;
  Entry& e = entry(w, n, i);
  if (e.epoch != epoch) {
    convert_to_bf16(ctx, w, e.data.data(), n);
    e.epoch = epoch;
    ++made_;
  }
  return e.data.data();
}

bf16* Bf16Weights::reserve(const float* w, int64_t n) {
  const int i = n > 0 ? range_of(w, n) : -1;
  AP_CHECK(i >= 0, "Bf16Weights::reserve: [{}, +{}) is not in a covered range",
           static_cast<const void*>(w), n);
  return entry(w, n, i).data.data();
}

void Bf16Weights::mark_current(const float* w) {
  const auto it = entries_.find(w);
  AP_CHECK(it != entries_.end() && ranges_[static_cast<size_t>(it->second.range)].synced,
           "Bf16Weights::mark_current: no array reserved for {} (or its range never synced)",
           static_cast<const void*>(w));
  it->second.epoch = ranges_[static_cast<size_t>(it->second.range)].epoch;
  ++marked_;
}

size_t Bf16Weights::bytes() const {
  size_t b = 0;
  for (const auto& [w, e] : entries_) b += static_cast<size_t>(e.n) * sizeof(bf16);
  return b;
}

}  // namespace actorpipe
