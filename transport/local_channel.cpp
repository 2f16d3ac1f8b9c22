// Local channel: in-process hand-off of tensors between stages of one pipeline. The storage
// pointer moves from sender to receiver; announcements are checked against what was posted.
#include "transport/local_channel.hpp"

#include <utility>

namespace actorpipe {

Expected<Announcement> LocalChannel::post(Tensor tensor, int64_t microbatch, int32_t version) {
  if (!tensor.defined())
    return make_error("channel {} ({} -> {}): posting an undefined tensor for microbatch {}",
                      ends().tag, ends().from, ends().to, microbatch);
  Announcement a;
  a.tag = ends().tag;
  a.microbatch = microbatch;
  a.version = version;
  a.dtype = tensor.dtype();
  a.ndim = tensor.dim();
  for (int i = 0; i < tensor.dim(); ++i) a.dims[static_cast<size_t>(i)] = tensor.size(i);
  std::lock_guard<std::mutex> lock(mu_);
  a.sequence = next_sequence_++;
  posted_.emplace(a.sequence, Entry{a, std::move(tensor)});
  return a;
}

Expected<Tensor> LocalChannel::receive(const Announcement& a) {
  if (a.tag != ends().tag)
    return make_error("channel {} ({} -> {}): announcement {} belongs to channel {}", ends().tag,
                      ends().from, ends().to, to_string(a), a.tag);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = posted_.find(a.sequence);
  if (it == posted_.end())
    return make_error("channel {} ({} -> {}): nothing posted for announcement {} ({} pending)",
                      ends().tag, ends().from, ends().to, to_string(a), posted_.size());
  if (!(it->second.announcement == a))
    return make_error("channel {} ({} -> {}): announcement {} does not match the posted {}",
                      ends().tag, ends().from, ends().to, to_string(a),
                      to_string(it->second.announcement));
  Tensor t = std::move(it->second.tensor);
  posted_.erase(it);
  return t;
}

size_t LocalChannel::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return posted_.size();
}

void LocalChannel::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  posted_.clear();
}

Expected<ChannelSet> make_local_channels(int stages, const std::vector<TiedPair>& tied) {
  if (stages < 1) return make_error("local channels: stages = {}, expected >= 1", stages);
  for (size_t k = 0; k < tied.size(); ++k) {
    const TiedPair& p = tied[k];
    if (p.owner_stage < 0 || p.owner_stage >= stages || p.copy_stage < 0 ||
        p.copy_stage >= stages) {
      return make_error(
          "local channels: tied parameter {} between stages {} and {}, expected stages in "
          "[0, {})",
          k, p.owner_stage, p.copy_stage, stages);
    }
  }
  std::vector<std::unique_ptr<TensorChannel>> channels;
  for (const ChannelEnds& e : channel_layout(stages, tied))
    channels.push_back(std::make_unique<LocalChannel>(e));
  return ChannelSet(stages, std::move(channels));
}

}  // namespace actorpipe
