// Tensor channel: the ends of a channel between neighbouring stages and the fixed-order set of
// all channels of a pipeline.
#include "transport/channel.hpp"

#include "kernels/check.hpp"

namespace actorpipe {

ChannelEnds channel_ends(int lower, Direction dir) {
  ChannelEnds e;
  e.kind = dir == Direction::forward ? ChannelKind::activation : ChannelKind::gradient;
  e.lower = lower;
  e.direction = dir;
  e.from = dir == Direction::forward ? lower : lower + 1;
  e.to = dir == Direction::forward ? lower + 1 : lower;
  e.tag = channel_tag(lower, dir);
  return e;
}

std::string to_string(ChannelKind k) {
  switch (k) {
    case ChannelKind::activation:
      return "activation";
    case ChannelKind::gradient:
      return "gradient";
    case ChannelKind::tied_to_owner:
      return "tied_to_owner";
    case ChannelKind::tied_to_copy:
      return "tied_to_copy";
    case ChannelKind::tied_weights:
      return "tied_weights";
    case ChannelKind::tied_prediction:
      return "tied_prediction";
  }
  return "unknown";
}

std::vector<ChannelEnds> channel_layout(int stages, const std::vector<TiedPair>& tied) {
  std::vector<ChannelEnds> out;
  for (int r = 0; r + 1 < stages; ++r) {
    out.push_back(channel_ends(r, Direction::forward));
    out.push_back(channel_ends(r, Direction::backward));
  }
  for (size_t k = 0; k < tied.size(); ++k) {
    const TiedPair& p = tied[k];
    if (p.owner_stage == p.copy_stage) continue;
    for (ChannelKind kind : {ChannelKind::tied_to_owner, ChannelKind::tied_to_copy,
                             ChannelKind::tied_weights, ChannelKind::tied_prediction}) {
      ChannelEnds e;
      e.kind = kind;
      e.tied = static_cast<int>(k);
      const bool to_owner = kind == ChannelKind::tied_to_owner;
      e.from = to_owner ? p.copy_stage : p.owner_stage;
      e.to = to_owner ? p.owner_stage : p.copy_stage;
      e.tag = static_cast<uint32_t>(out.size());
      out.push_back(e);
    }
  }
  return out;
}

ChannelSet::ChannelSet(int stages, std::vector<std::unique_ptr<TensorChannel>> channels)
    : ChannelSet(stages, std::move(channels), false) {}

ChannelSet ChannelSet::partial(int stages, std::vector<std::unique_ptr<TensorChannel>> channels) {
  return ChannelSet(stages, std::move(channels), true);
}

ChannelSet::ChannelSet(int stages, std::vector<std::unique_ptr<TensorChannel>> channels,
                       bool allow_missing)
    : stages_(stages), channels_(std::move(channels)) {
  AP_CHECK(stages_ >= 1, "a channel set of {} stages", stages_);
  const size_t pipeline = 2 * static_cast<size_t>(stages_ - 1);
  AP_CHECK(channels_.size() >= pipeline && (channels_.size() - pipeline) % 4 == 0,
           "a channel set of {} stages holds {} channels", stages_, channels_.size());
  for (size_t i = 0; i < channels_.size(); ++i) {
    if (channels_[i] == nullptr) {
      AP_CHECK(allow_missing, "channel {} is null", i);
      continue;
    }
    AP_CHECK(channels_[i]->ends().tag == i, "channel at index {} has tag {}", i,
             channels_[i]->ends().tag);
  }
}

TensorChannel* ChannelSet::find_tied(int k, ChannelKind kind) const {
  const size_t pipeline = 2 * static_cast<size_t>(stages_ - 1);
  for (size_t i = pipeline; i < channels_.size(); ++i) {
    if (channels_[i] == nullptr) continue;
    const ChannelEnds& e = channels_[i]->ends();
    if (e.tied == k && e.kind == kind) return channels_[i].get();
  }
  return nullptr;
}

BackendMemory* ChannelSet::send_memory(uint32_t tag) const {
  return has(tag) ? channels_[tag]->send_memory() : nullptr;
}

BackendMemory* ChannelSet::tied_send_memory(int k, ChannelKind kind) const {
  TensorChannel* c = find_tied(k, kind);
  return c != nullptr ? c->send_memory() : nullptr;
}

TensorChannel& ChannelSet::tied(int k, ChannelKind kind) const {
  TensorChannel* c = find_tied(k, kind);
  AP_CHECK(c != nullptr, "no {} channel for tied parameter {}", to_string(kind), k);
  return *c;
}

TensorChannel& ChannelSet::at(uint32_t tag) const {
  AP_CHECK(tag < channels_.size(), "no channel with tag {} (set of {})", tag, channels_.size());
  AP_CHECK(channels_[tag] != nullptr, "this process holds no end of channel {} (set of {})", tag,
           channels_.size());
  return *channels_[tag];
}

ChannelTraffic ChannelSet::traffic() const {
  ChannelTraffic t;
  for (const auto& c : channels_)
    if (c != nullptr) t += c->traffic();
  return t;
}

size_t ChannelSet::pending() const {
  size_t n = 0;
  for (const auto& c : channels_)
    if (c) n += c->pending();
  return n;
}

void ChannelSet::clear() {
  for (auto& c : channels_)
    if (c) c->clear();
}

void ChannelSet::interrupt(const std::string& reason) {
  for (auto& c : channels_)
    if (c) c->interrupt(reason);
}

}  // namespace actorpipe
