// GPU links: the NCCL links of one process's channels between its GPU stages and another
// process's (cluster.gpu_channel = "nccl"). Made at a run's start, their unique ids handed round
// through the process group, and kept for the group's later runs while every end is alive.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/expected.hpp"
#include "kernels/backend_memory.hpp"
#include "transport/channel.hpp"
#include "transport/nccl_channel.hpp"

namespace actorpipe {

class ProcessGroup;

class GpuLinks {
 public:
  /// Whether channel `ends` of a pipeline placed by `rank_of_stage` is an NCCL one: an
  /// activation or gradient channel between stages of two different ranks. (The tied
  /// parameters' channels carry host tensors: UCX's.)
  static bool carries(const ChannelEnds& ends, const std::vector<int>& rank_of_stage);

  /// Makes, or keeps from the last run, the links of this process's NCCL channels, in the fixed
  /// order of channel_layout(). `memory_of_stage[r]`: stage r's lasting memory on its GPU, for
  /// this process's stages. Every rank of the group calls it at the same point (it all-gathers
  /// twice at most: whether every rank still holds its links, then the new links' ids, each made
  /// by the sending end's process). Errors: no NCCL in this build, a stage not on a GPU, the
  /// all-gather's failure, a link that cannot be made within `timeout` (naming the channel).
  Status prepare(ProcessGroup& group, const std::vector<int>& rank_of_stage,
                 const std::vector<TiedPair>& tied,
                 const std::vector<BackendMemory*>& memory_of_stage,
                 std::chrono::milliseconds timeout);

  /// This process's end of NCCL channel `ends` (carries() is true; prepare() made its link);
  /// null for a channel that is not an NCCL one.
  std::unique_ptr<TensorChannel> channel(const ChannelEnds& ends,
                                         const std::vector<int>& rank_of_stage,
                                         NcclChannelOptions options) const;

  /// Ends every link (after a failed run): the next prepare() makes new ones on every rank.
  void drop();

  /// Links held (alive or not).
  size_t size() const { return links_.size(); }

 private:
  std::map<uint32_t, std::shared_ptr<NcclLink>> links_;  // channel tag -> link
};

}  // namespace actorpipe
