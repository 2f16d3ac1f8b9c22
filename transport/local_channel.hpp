// Local channel: in-process tensor hand-off between stages. Posting moves the Tensor (a view on
// shared storage) into the channel and receiving moves it out: no byte of the payload is copied.
#pragma once

#include <map>
#include <mutex>

#include "transport/channel.hpp"

namespace actorpipe {

/// In-process channel: a small map from sequence number to the posted tensor, under a mutex
/// (one sender, one receiver). The received Tensor shares storage with the posted one.
class LocalChannel final : public TensorChannel {
 public:
  explicit LocalChannel(ChannelEnds ends) : TensorChannel(ends) {}

  Expected<Announcement> post(Tensor tensor, int64_t microbatch, int32_t version) override;
  Expected<Tensor> receive(const Announcement& a) override;
  size_t pending() const override;
  void clear() override;

 private:
  struct Entry {
    Announcement announcement;
    Tensor tensor;
  };
  mutable std::mutex mu_;
  uint64_t next_sequence_ = 0;
  std::map<uint64_t, Entry> posted_;
};

/// The channels of a `stages`-stage pipeline (and its tied parameters), all local, in the fixed
/// order of channel_layout(). Errors: stages < 1, a tied pair outside [0, stages).
Expected<ChannelSet> make_local_channels(int stages, const std::vector<TiedPair>& tied = {});

}  // namespace actorpipe
