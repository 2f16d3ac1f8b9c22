// GPU links: which channels of a placed pipeline go over NCCL (activations and gradients between
// stages of two processes; never the tied parameters' channels, never a channel within one
// process). Making the links needs GPUs: scripts/gpu_run.sh checks them on a GPU machine.
#include "actors/gpu_links.hpp"

#include <doctest/doctest.h>

#include <vector>

using namespace actorpipe;

TEST_CASE("NCCL carries the activation and gradient channels between two processes only") {
  // stages 0, 1 on rank 0, stages 2, 3 on rank 1; a tied parameter between stages 0 and 3
  const std::vector<int> ranks{0, 0, 1, 1};
  const std::vector<ChannelEnds> layout = channel_layout(4, {TiedPair{0, 3}});
  std::vector<uint32_t> nccl;
  for (const ChannelEnds& ends : layout)
    if (GpuLinks::carries(ends, ranks)) nccl.push_back(ends.tag);
  // pair (1, 2): forward tag 2, backward tag 3; pairs (0, 1) and (2, 3) are within a process
  CHECK(nccl == std::vector<uint32_t>{2, 3});
  // the tied channels cross the processes too, but carry host tensors: UCX
  int tied_across = 0;
  for (const ChannelEnds& ends : layout)
    if (ends.tied >= 0 &&
        ranks[static_cast<size_t>(ends.from)] != ranks[static_cast<size_t>(ends.to)])
      ++tied_across;
  CHECK(tied_across == 4);
  // one stage per process: every stage channel
  nccl.clear();
  for (const ChannelEnds& ends : channel_layout(3))
    if (GpuLinks::carries(ends, {0, 1, 2})) nccl.push_back(ends.tag);
  CHECK(nccl == std::vector<uint32_t>{0, 1, 2, 3});
  // one process: none
  for (const ChannelEnds& ends : channel_layout(3)) CHECK_FALSE(GpuLinks::carries(ends, {0, 0, 0}));
}

TEST_CASE("links are made only when asked for: a new GpuLinks holds none, drop() empties it") {
  GpuLinks links;
  CHECK(links.size() == 0);
  links.drop();
  CHECK(links.size() == 0);
  // a channel that is no NCCL one gets no NCCL end
  const ChannelEnds local = channel_ends(0, Direction::forward);
  CHECK(links.channel(local, {0, 0}, {}) == nullptr);
}
