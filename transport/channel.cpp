// Tensor channel: the ends of a channel between neighbouring stages and the fixed-order set of
// all channels of a pipeline.
#include "transport/channel.hpp"

#include "kernels/check.hpp"

namespace actorpipe {

ChannelEnds channel_ends(int lower, Direction dir) {
  ChannelEnds e;
  e.lower = lower;
  e.direction = dir;
  e.from = dir == Direction::forward ? lower : lower + 1;
  e.to = dir == Direction::forward ? lower + 1 : lower;
  e.tag = channel_tag(lower, dir);
  return e;
}

ChannelSet::ChannelSet(std::vector<std::unique_ptr<TensorChannel>> channels)
    : ChannelSet(std::move(channels), false) {}

ChannelSet ChannelSet::partial(std::vector<std::unique_ptr<TensorChannel>> channels) {
  return ChannelSet(std::move(channels), true);
}

ChannelSet::ChannelSet(std::vector<std::unique_ptr<TensorChannel>> channels, bool allow_missing)
    : channels_(std::move(channels)) {
  AP_CHECK(channels_.size() % 2 == 0, "a channel set holds pairs, got {}", channels_.size());
  for (size_t i = 0; i < channels_.size(); ++i) {
    if (channels_[i] == nullptr) {
      AP_CHECK(allow_missing, "channel {} is null", i);
      continue;
    }
    AP_CHECK(channels_[i]->ends().tag == i, "channel at index {} has tag {}", i,
             channels_[i]->ends().tag);
  }
}

TensorChannel& ChannelSet::at(uint32_t tag) const {
  AP_CHECK(tag < channels_.size(), "no channel with tag {} (set of {})", tag, channels_.size());
  AP_CHECK(channels_[tag] != nullptr, "this process holds no end of channel {} (set of {})", tag,
           channels_.size());
  return *channels_[tag];
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

}  // namespace actorpipe
