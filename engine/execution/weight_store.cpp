// Weight-version store of one pipeline stage: immutable parameter versions (one buffer per layer
// of the stage), microbatches bound to the version their forward used, and the update policy.
#include "engine/execution/weight_store.hpp"

#include <algorithm>
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
                         int max_in_flight)
    : policy_(policy), layer_sizes_(std::move(layer_floats)) {
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
  buffers_.resize(static_cast<size_t>(capacity));
  for (auto& b : buffers_) b.assign(total, 0.0f);
  ids_.assign(static_cast<size_t>(capacity), -1);
  ids_[0] = 0;
  max_in_flight_ = static_cast<size_t>(max_in_flight);
  bound_.reserve(max_in_flight_);
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
  for (int id : ids_)
    if (id >= 0) out.push_back(id);
  std::sort(out.begin(), out.end());
  return out;
}

std::span<const float> WeightStore::params(int version, int layer) const {
  const int b = find(version);
  AP_CHECK(b >= 0, "version {} is not stored (stored: {})", version, fmt::join(versions(), ", "));
  const size_t l = static_cast<size_t>(layer);
  AP_CHECK(layer >= 0 && layer < num_layers(), "layer {} of {}", layer, num_layers());
  return {buffers_[static_cast<size_t>(b)].data() + layer_offsets_[l], layer_sizes_[l]};
}

std::span<float> WeightStore::mutable_params(int version, int layer) {
  const int b = find(version);
  AP_CHECK(b >= 0, "version {} is not stored (stored: {})", version, fmt::join(versions(), ", "));
  for (const auto& [mb, buffer] : bound_) {
    AP_CHECK(buffer != b, "version {} is written while microbatch {} is bound to it", version, mb);
  }
  AP_CHECK(layer >= 0 && layer < num_layers(), "layer {} of {}", layer, num_layers());
  ++generation_;  // the caller writes it
  const size_t l = static_cast<size_t>(layer);
  return {buffers_[static_cast<size_t>(b)].data() + layer_offsets_[l], layer_sizes_[l]};
}

void WeightStore::reset(int version) {
  AP_CHECK(bound_.empty() && updating_ < 0, "reset with {} microbatches bound", bound_.size());
  AP_CHECK(version >= 0, "version {}", version);
  for (size_t b = 0; b < ids_.size(); ++b) ids_[b] = -1;
  ids_[static_cast<size_t>(latest_buffer_)] = version;
  ++generation_;
}

void WeightStore::add_older(int version) {
  AP_CHECK(updating_ < 0, "add_older({}) while an update is open", version);
  AP_CHECK(version >= 0 && version < latest(), "add_older({}): it must be in [0, {})", version,
           latest());
  AP_CHECK(!holds(version), "add_older({}): version {} is already stored", version, version);
  for (size_t b = 0; b < ids_.size(); ++b) {
    if (ids_[b] >= 0) continue;
    ids_[b] = version;
    ++generation_;
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

void WeightStore::begin_update() {
  AP_CHECK(updating_ < 0, "an update is already open");
  if (capacity() == 1) {
    AP_CHECK(policy_ == VersionPolicy::predicted || bound_.empty(),
             "policy {} updates its only version in place, but {} microbatches are bound to it "
             "(a saved activation would see other weights at its backward)",
             to_string(policy_), bound_.size());
    updating_ = latest_buffer_;
    ++generation_;
    return;
  }
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
  const auto& src = buffers_[static_cast<size_t>(latest_buffer_)];
  std::copy(src.begin(), src.end(), buffers_[static_cast<size_t>(target)].begin());
  updating_ = target;
  ++generation_;
}

std::span<float> WeightStore::update_params(int layer) {
  AP_CHECK(updating_ >= 0, "no update is open");
  AP_CHECK(layer >= 0 && layer < num_layers(), "layer {} of {}", layer, num_layers());
  ++generation_;  // the caller writes it
  const size_t l = static_cast<size_t>(layer);
  return {buffers_[static_cast<size_t>(updating_)].data() + layer_offsets_[l], layer_sizes_[l]};
}

void WeightStore::commit_update() {
  AP_CHECK(updating_ >= 0, "no update is open");
  const int next = latest() + 1;
  ids_[static_cast<size_t>(updating_)] = next;
  latest_buffer_ = updating_;
  updating_ = -1;
  ++generation_;
  note_peak();
}

}  // namespace actorpipe

namespace actorpipe {

std::vector<std::span<const float>> WeightStore::buffers() const {
  std::vector<std::span<const float>> out;
  for (const auto& b : buffers_) out.emplace_back(b.data(), b.size());
  return out;
}

}  // namespace actorpipe
