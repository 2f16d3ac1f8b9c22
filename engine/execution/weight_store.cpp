// Weight-version store of one pipeline stage: immutable parameter versions (one buffer per layer
// of the stage), microbatches bound to the version their forward used, and the update policy.
#include "engine/execution/weight_store.hpp"

#include <algorithm>
#include <iterator>
#include <numeric>

#include "kernels/check.hpp"

namespace actorpipe {

std::string_view to_string(VersionPolicy policy) {
  switch (policy) {
    case VersionPolicy::single:
      return "single";
    case VersionPolicy::double_buffered:
      return "double_buffered";
    case VersionPolicy::ring:
      return "ring";
    case VersionPolicy::predicted:
      return "predicted";
  }
  return "?";
}

VersionPolicy version_policy(Mode mode) {
  switch (mode) {
    case Mode::gpipe:
    case Mode::onef1b:
      return VersionPolicy::single;
    case Mode::twobw:
      return VersionPolicy::double_buffered;
    case Mode::pipedream:
      return VersionPolicy::ring;
    case Mode::xpipe:
      return VersionPolicy::predicted;
  }
  AP_CHECK(false, "unknown mode {}", static_cast<int>(mode));
  return VersionPolicy::single;
}

int version_capacity(Mode mode, int stages, int stage) {
  AP_CHECK(stage >= 0 && stage < stages, "stage {} of {}", stage, stages);
  switch (version_policy(mode)) {
    case VersionPolicy::single:
    case VersionPolicy::predicted:
      return 1;
    case VersionPolicy::double_buffered:
      return 2;
    case VersionPolicy::ring:
      return stages - stage;
  }
  return 1;
}

WeightStore::WeightStore(VersionPolicy policy, int capacity, std::vector<size_t> layer_floats,
                         int max_in_flight, std::vector<StashRange> bf16_stash,
                         BackendMemory& memory)
    : policy_(policy), layer_sizes_(std::move(layer_floats)), memory_(&memory) {
  AP_CHECK(capacity >= 1, "a weight store needs at least one version buffer, got {}", capacity);
  AP_CHECK(capacity == 1 || (policy != VersionPolicy::single && policy != VersionPolicy::predicted),
           "policy {} keeps one version, not {}", to_string(policy), capacity);
  AP_CHECK(policy != VersionPolicy::double_buffered || capacity == 2,
           "double_buffered keeps two versions, not {}", capacity);
  AP_CHECK(max_in_flight >= 0, "max_in_flight = {}", max_in_flight);
  size_t total = 0;
  for (size_t n : layer_sizes_) {
    layer_offsets_.push_back(total);
    total += n;
  }
  total_ = total;
  for (int b = 0; b < capacity; ++b) {  // zeros
    if (memory.host_memory()) {
      buffers_.emplace_back(total);
      base_.push_back(buffers_.back().data());
    } else {
      allocations_.emplace_back(memory, total);
      base_.push_back(allocations_.back().data());
    }
  }
  ids_.assign(static_cast<size_t>(capacity), -1);
  generations_.assign(static_cast<size_t>(capacity) * layer_sizes_.size(), 0);
  ids_[0] = 0;
  max_in_flight_ = static_cast<size_t>(max_in_flight);
  bound_.reserve(max_in_flight_);
  if (bf16_stash.empty() || capacity == 1) return;
  AP_CHECK(policy == VersionPolicy::double_buffered || policy == VersionPolicy::ring,
           "a bf16 stash keeps stashed versions, which policy {} has none of", to_string(policy));
  AP_CHECK(memory.host_memory(),
           "a bf16 weight stash rounds its versions on the host: not in the memory of {}",
           memory.name());
  size_t bf16_floats = 0;
  for (const StashRange& r : bf16_stash) {
    AP_CHECK(r.layer >= 0 && r.layer < num_layers() && r.n > 0 &&
                 r.offset + r.n <= layer_sizes_[static_cast<size_t>(r.layer)],
             "bf16 stash range [{}, {}) of layer {} ({} layers)", r.offset, r.offset + r.n, r.layer,
             num_layers());
    const size_t at = layer_offsets_[static_cast<size_t>(r.layer)] + r.offset;
    AP_CHECK(stash_.empty() || at >= stash_.back().at + stash_.back().n,
             "bf16 stash ranges must be ascending and disjoint (layer {}, offset {})", r.layer,
             r.offset);
    stash_.push_back({r.layer, at, r.n, bf16_floats});
    bf16_floats += r.n;
  }
  stash_bf16_.resize(static_cast<size_t>(capacity));
  widened_.resize(static_cast<size_t>(capacity));
  for (int b = 1; b < capacity; ++b) {
    stash_bf16_[static_cast<size_t>(b)].resize(bf16_floats);
    widened_[static_cast<size_t>(b)].assign(layer_sizes_.size(), 0);
  }
}

size_t WeightStore::layer_floats(int layer) const {
  AP_CHECK(layer >= 0 && layer < num_layers(), "layer {} of {}", layer, num_layers());
  return layer_sizes_[static_cast<size_t>(layer)];
}

int WeightStore::find(int version) const {
  if (version < 0) return -1;
  for (size_t b = 0; b < ids_.size(); ++b)
    if (ids_[b] == version && static_cast<int>(b) != updating_) return static_cast<int>(b);
  return -1;
}

std::vector<int> WeightStore::versions() const {
  std::vector<int> out;
  for (size_t b = 0; b < ids_.size(); ++b)
    if (ids_[b] >= 0 && static_cast<int>(b) != updating_) out.push_back(ids_[b]);
  std::sort(out.begin(), out.end());
  return out;
}

std::span<const float> WeightStore::params(int version, int layer) const {
  const int b = find(version);
  AP_CHECK(b >= 0, "version {} is not stored (stored: {})", version, fmt::join(versions(), ", "));
  const size_t l = static_cast<size_t>(layer);
  AP_CHECK(layer >= 0 && layer < num_layers(), "layer {} of {}", layer, num_layers());
  return {base_[static_cast<size_t>(b)] + layer_offsets_[l], layer_sizes_[l]};
}

std::span<float> WeightStore::mutable_params(int version, int layer) {
  const int b = find(version);
  AP_CHECK(b >= 0, "version {} is not stored (stored: {})", version, fmt::join(versions(), ", "));
  for (const auto& [mb, buffer] : bound_) {
    AP_CHECK(buffer != b, "version {} is written while microbatch {} is bound to it", version, mb);
  }
  AP_CHECK(layer >= 0 && layer < num_layers(), "layer {} of {}", layer, num_layers());
  changed(b, layer);  // the caller writes it
  if (stashed(b)) widen(b, layer);
  const size_t l = static_cast<size_t>(layer);
  return {base_[static_cast<size_t>(b)] + layer_offsets_[l], layer_sizes_[l]};
}

void WeightStore::reset(int version) {
  AP_CHECK(bound_.empty() && updating_ < 0, "reset with {} microbatches bound", bound_.size());
  AP_CHECK(version >= 0, "version {}", version);
  for (size_t b = 0; b < ids_.size(); ++b) ids_[b] = -1;
  settle();  // nothing stashed is left: widened layers give their pages back
  ids_[static_cast<size_t>(latest_buffer_)] = version;  // renamed, not written
}

void WeightStore::add_older(int version) {
  AP_CHECK(updating_ < 0, "add_older({}) while an update is open", version);
  AP_CHECK(version >= 0 && version < latest(), "add_older({}): it must be in [0, {})", version,
           latest());
  AP_CHECK(!holds(version), "add_older({}): version {} is already stored", version, version);
  for (size_t b = 0; b < ids_.size(); ++b) {
    if (ids_[b] >= 0) continue;
    ids_[b] = version;
    changed(static_cast<int>(b));
    return;
  }
  AP_CHECK(false, "add_older({}): every buffer holds a version (stored: {})", version,
           fmt::join(versions(), ", "));
}

int WeightStore::bound_index(int microbatch) const {
  for (size_t i = 0; i < bound_.size(); ++i)
    if (bound_[i].first == microbatch) return static_cast<int>(i);
  return -1;
}

bool WeightStore::pinned(int buffer) const {
  if (ids_[static_cast<size_t>(buffer)] < 0) return false;
  if (buffer == latest_buffer_) return true;
  for (const auto& [mb, b] : bound_)
    if (b == buffer) return true;
  return false;
}

void WeightStore::note_peak() {
  peak_versions_ = std::max(peak_versions_, versions_pinned());
}

int WeightStore::versions_pinned() const {
  int n = 0;
  for (int b = 0; b < capacity(); ++b) n += pinned(b) ? 1 : 0;
  return n;
}

void WeightStore::bind(int microbatch, int version) {
  AP_CHECK(policy_ != VersionPolicy::predicted,
           "the predicted policy binds no version (its backward uses the newest weights)");
  AP_CHECK(bound_index(microbatch) < 0, "microbatch {} is already bound to version {}", microbatch,
           bound_version(microbatch));
  AP_CHECK(bound_.size() < max_in_flight_, "microbatch {}: {} microbatches already in flight",
           microbatch, bound_.size());
  const int b = find(version);
  AP_CHECK(b >= 0,
           "microbatch {} needs version {}, which is not stored (stored: {}; policy {}, "
           "{} buffers)",
           microbatch, version, fmt::join(versions(), ", "), to_string(policy_), capacity());
  bound_.emplace_back(microbatch, b);
  note_peak();
}

int WeightStore::bound_version(int microbatch) const {
  const int i = bound_index(microbatch);
  return i < 0 ? -1 : ids_[static_cast<size_t>(bound_[static_cast<size_t>(i)].second)];
}

void WeightStore::release(int microbatch) {
  const int i = bound_index(microbatch);
  AP_CHECK(i >= 0, "microbatch {} is not bound", microbatch);
  bound_.erase(bound_.begin() + i);
}

int WeightStore::update_target() const {
  // the oldest stored, unpinned buffer; else an empty one
  int target = -1;
  for (int b = 0; b < capacity(); ++b) {
    const int id = ids_[static_cast<size_t>(b)];
    if (id < 0 || pinned(b)) continue;
    if (target < 0 || id < ids_[static_cast<size_t>(target)]) target = b;
  }
  for (int b = 0; b < capacity() && target < 0; ++b)
    if (ids_[static_cast<size_t>(b)] < 0) target = b;
  AP_CHECK(target >= 0,
           "update to version {}: all {} buffers of policy {} are pinned (stored: {}; {} "
           "microbatches in flight)",
           latest() + 1, capacity(), to_string(policy_), fmt::join(versions(), ", "),
           bound_.size());
  return target;
}

void WeightStore::begin_update() {
  AP_CHECK(updating_ < 0, "an update is already open");
  if (!stash_.empty()) {
    // the newest version moves to the oldest unpinned stashed buffer (else an empty one), and
    // buffer 0 (the newest: pinned) is updated in place
    const int target = update_target();
    stash_newest(target);
    ids_[static_cast<size_t>(target)] = latest();
    for (auto& [mb, b] : bound_)
      if (b == 0) b = target;
    updating_ = 0;
    changed(target);
    changed(0);
    return;
  }
  if (capacity() == 1) {
    AP_CHECK(policy_ == VersionPolicy::predicted || bound_.empty(),
             "policy {} updates its only version in place, but {} microbatches are bound to it "
             "(a saved activation would see other weights at its backward)",
             to_string(policy_), bound_.size());
    updating_ = latest_buffer_;
    changed(updating_);
    return;
  }
  const int target = update_target();
  memory_->copy(base_[static_cast<size_t>(target)], base_[static_cast<size_t>(latest_buffer_)],
                total_);
  updating_ = target;
  changed(target);
}

std::span<float> WeightStore::update_params(int layer) {
  AP_CHECK(updating_ >= 0, "no update is open");
  AP_CHECK(layer >= 0 && layer < num_layers(), "layer {} of {}", layer, num_layers());
  changed(updating_, layer);  // the caller writes it
  const size_t l = static_cast<size_t>(layer);
  return {base_[static_cast<size_t>(updating_)] + layer_offsets_[l], layer_sizes_[l]};
}

void WeightStore::commit_update() {
  AP_CHECK(updating_ >= 0, "no update is open");
  const int next = latest() + 1;
  ids_[static_cast<size_t>(updating_)] = next;
  latest_buffer_ = updating_;
  // written since begin_update: a copy made meanwhile (nothing should read it) is not kept
  changed(updating_);
  updating_ = -1;
  note_peak();
}

}  // namespace actorpipe

namespace actorpipe {

uint64_t WeightStore::generation(int buffer, int layer) const {
  AP_CHECK(buffer >= 0 && buffer < capacity() && layer >= 0 && layer < num_layers(),
           "buffer {} of {}, layer {} of {}", buffer, capacity(), layer, num_layers());
  return generations_[static_cast<size_t>(buffer) * layer_sizes_.size() +
                      static_cast<size_t>(layer)];
}

std::span<const float> WeightStore::buffer(int b, int layer) const {
  AP_CHECK(b >= 0 && b < capacity() && layer >= 0 && layer < num_layers(),
           "buffer {} of {}, layer {} of {}", b, capacity(), layer, num_layers());
  const size_t l = static_cast<size_t>(layer);
  return {base_[static_cast<size_t>(b)] + layer_offsets_[l], layer_sizes_[l]};
}

void WeightStore::changed(int buffer) {
  for (int l = 0; l < num_layers(); ++l) changed(buffer, l);
}

void WeightStore::changed(int buffer, int layer) {
  ++generations_[static_cast<size_t>(buffer) * layer_sizes_.size() + static_cast<size_t>(layer)];
}

std::vector<std::span<const float>> WeightStore::buffers() const {
  std::vector<std::span<const float>> out;
  for (const float* b : base_) out.emplace_back(b, total_);
  return out;
}

}  // namespace actorpipe

namespace actorpipe {

void WeightStore::stash_newest(int buffer) {
  const size_t t = static_cast<size_t>(buffer);
  const float* src = buffers_[0].data();
  float* dst = buffers_[t].data();
  std::vector<char>& widened = widened_[t];
  size_t pos = 0;
  for (const Range& r : stash_) {
    std::copy(src + pos, src + r.at, dst + pos);
    convert_to_bf16(src + r.at, stash_bf16_[t].data() + r.bf16_at, static_cast<int64_t>(r.n));
    if (widened[static_cast<size_t>(r.layer)] != 0) buffers_[t].release(r.at, r.n);
    pos = r.at + r.n;
  }
  std::copy(src + pos, src + buffers_[0].size(), dst + pos);
  std::fill(widened.begin(), widened.end(), 0);
}

void WeightStore::widen(int buffer, int layer) {
  const size_t b = static_cast<size_t>(buffer);
  char& flag = widened_[b][static_cast<size_t>(layer)];
  if (flag != 0) return;
  for (const Range& r : stash_) {
    if (r.layer != layer) continue;
    convert_to_f32(stash_bf16_[b].data() + r.bf16_at, buffers_[b].data() + r.at,
                   static_cast<int64_t>(r.n));
  }
  flag = 1;
}

void WeightStore::settle() {
  for (int b = 1; b < static_cast<int>(widened_.size()); ++b) {
    const size_t k = static_cast<size_t>(b);
    for (const Range& r : stash_) {
      if (widened_[k][static_cast<size_t>(r.layer)] == 0) continue;
      if (ids_[k] >= 0)
        convert_to_bf16(buffers_[k].data() + r.at, stash_bf16_[k].data() + r.bf16_at,
                        static_cast<int64_t>(r.n));
      buffers_[k].release(r.at, r.n);
      changed(b, r.layer);
    }
    std::fill(widened_[k].begin(), widened_[k].end(), 0);
  }
}

int WeightStore::stash_range_at(size_t offset, size_t n) const {
  // the last range starting at or before offset
  auto it = std::upper_bound(stash_.begin(), stash_.end(), offset,
                             [](size_t o, const Range& r) { return o < r.at; });
  if (it != stash_.begin()) {
    const Range& r = *std::prev(it);
    if (offset < r.at + r.n) {
      AP_CHECK(offset + n <= r.at + r.n,
               "floats [{}, {}) straddle the end of a bf16-stashed slot [{}, {})", offset,
               offset + n, r.at, r.at + r.n);
      return static_cast<int>(std::prev(it) - stash_.begin());
    }
  }
  AP_CHECK(it == stash_.end() || offset + n <= it->at,
           "floats [{}, {}) straddle the start of a bf16-stashed slot at {}", offset, offset + n,
           it == stash_.end() ? 0 : it->at);
  return -1;
}

const bf16* WeightStore::stashed_bf16(const float* w, size_t n) const {
  for (int b = 1; b < static_cast<int>(stash_bf16_.size()); ++b) {
    const size_t k = static_cast<size_t>(b);
    const float* base = buffers_[k].data();
    if (w < base || w >= base + buffers_[k].size()) continue;
    if (ids_[k] < 0) return nullptr;
    const size_t offset = static_cast<size_t>(w - base);
    const int i = stash_range_at(offset, n);
    if (i < 0) return nullptr;
    const Range& r = stash_[static_cast<size_t>(i)];
    if (widened_[k][static_cast<size_t>(r.layer)] != 0) return nullptr;
    return stash_bf16_[k].data() + r.bf16_at + (offset - r.at);
  }
  return nullptr;
}

const bf16* WeightStore::stashed_bf16(int version, int layer, size_t offset, size_t n) const {
  const std::span<const float> p = params(version, layer);
  AP_CHECK(offset + n <= p.size(), "floats [{}, {}) of a layer of {}", offset, offset + n,
           p.size());
  return stashed_bf16(p.data() + offset, n);
}

size_t WeightStore::resident_bytes() const {
  size_t bytes = 0;
  for (const PageBuffer& b : buffers_) bytes += b.resident_bytes();
  for (const BackendBuffer& b : allocations_) bytes += b.size() * sizeof(float);
  for (const auto& v : stash_bf16_) bytes += v.size() * sizeof(bf16);
  return bytes;
}

}  // namespace actorpipe
