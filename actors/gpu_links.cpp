// GPU links: which channels go over NCCL, and their links made through the process group.
#include "actors/gpu_links.hpp"

#include <fmt/format.h>

#include <iterator>
#include <sstream>

#include "actors/process_group.hpp"
#include "kernels/check.hpp"

namespace actorpipe {

namespace {

// "<tag>=<id>;..." for the channels a rank sends on, and back
std::string encode_ids(const std::map<uint32_t, std::string>& ids) {
  fmt::memory_buffer out;
  for (const auto& [tag, id] : ids) fmt::format_to(std::back_inserter(out), "{}={};", tag, id);
  return fmt::to_string(out);
}

std::map<uint32_t, std::string> decode_ids(const std::string& text) {
  std::map<uint32_t, std::string> out;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ';')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) continue;
    out[static_cast<uint32_t>(std::stoul(item.substr(0, eq)))] = item.substr(eq + 1);
  }
  return out;
}

}  // namespace

bool GpuLinks::carries(const ChannelEnds& ends, const std::vector<int>& rank_of_stage) {
  if (ends.kind != ChannelKind::activation && ends.kind != ChannelKind::gradient) return false;
  return rank_of_stage.at(static_cast<size_t>(ends.from)) !=
         rank_of_stage.at(static_cast<size_t>(ends.to));
}

Status GpuLinks::prepare(ProcessGroup& group, const std::vector<int>& rank_of_stage,
                         const std::vector<TiedPair>& tied,
                         const std::vector<BackendMemory*>& memory_of_stage,
                         std::chrono::milliseconds timeout) {
  const int rank = group.rank();
  const int stages = static_cast<int>(rank_of_stage.size());
  // this process's NCCL channels, in the fixed order
  std::vector<ChannelEnds> mine;
  for (const ChannelEnds& ends : channel_layout(stages, tied)) {
    if (!carries(ends, rank_of_stage)) continue;
    const int from = rank_of_stage[static_cast<size_t>(ends.from)];
    const int to = rank_of_stage[static_cast<size_t>(ends.to)];
    if (from == rank || to == rank) mine.push_back(ends);
  }
  bool live = true;
  for (const ChannelEnds& ends : mine) {
    auto it = links_.find(ends.tag);
    live = live && it != links_.end() && !it->second->dead();
  }
  if (!mine.empty()) {
    if (const std::string why = nccl_unavailable_reason(); !why.empty())
      return make_error("cluster.gpu_channel = \"nccl\": {}; \"ucx\" stages through the host", why);
  }
  // round 1: does every rank still hold its links?
  RankPart state;
  state.text.push_back(live ? '1' : '0');
  auto states = group.all_gather(std::move(state));
  if (!states) return make_error("NCCL links: {}", states.error().message);
  bool all_live = true;
  for (const RankPart& p : *states) all_live = all_live && p.text == "1";
  if (all_live) return {};

  // round 2: new links everywhere; the sending end's process makes each id
  drop();
  std::map<uint32_t, std::string> made;
  for (const ChannelEnds& ends : mine) {
    if (rank_of_stage[static_cast<size_t>(ends.from)] != rank) continue;
    auto id = nccl_unique_id();
    if (!id) return make_error("NCCL links: {}", id.error().message);
    made[ends.tag] = std::move(*id);
  }
  RankPart ids;
  ids.text = encode_ids(made);
  auto parts = group.all_gather(std::move(ids));
  if (!parts) return make_error("NCCL links: {}", parts.error().message);
  for (const ChannelEnds& ends : mine) {
    const bool sender = rank_of_stage[static_cast<size_t>(ends.from)] == rank;
    const int local = sender ? ends.from : ends.to;
    const int id_rank = rank_of_stage[static_cast<size_t>(ends.from)];
    BackendMemory* memory = memory_of_stage.at(static_cast<size_t>(local));
    AP_CHECK(memory != nullptr, "NCCL links: stage {} of rank {} has no memory", local, rank);
    const std::map<uint32_t, std::string> theirs =
        decode_ids((*parts)[static_cast<size_t>(id_rank)].text);
    auto id = theirs.find(ends.tag);
    if (id == theirs.end())
      return make_error("NCCL links: rank {} sent no id for channel {} (stage {} -> {})", id_rank,
                        ends.tag, ends.from, ends.to);
    auto link = NcclLink::connect(id->second, sender, *memory, timeout);
    if (!link)
      return make_error("NCCL channel {} (stage {} on rank {} -> stage {} on rank {}): {}",
                        ends.tag, ends.from, rank_of_stage[static_cast<size_t>(ends.from)], ends.to,
                        rank_of_stage[static_cast<size_t>(ends.to)], link.error().message);
    links_[ends.tag] = std::move(*link);
  }
  return {};
}

std::unique_ptr<TensorChannel> GpuLinks::channel(const ChannelEnds& ends,
                                                 const std::vector<int>& rank_of_stage,
                                                 NcclChannelOptions options) const {
  if (!carries(ends, rank_of_stage)) return nullptr;
  auto it = links_.find(ends.tag);
  AP_CHECK(it != links_.end(), "NCCL channel {}: no link (prepare() first)", ends.tag);
  if (it->second->sender()) return NcclChannel::sender(it->second, ends, options);
  return NcclChannel::receiver(it->second, ends, options);
}

void GpuLinks::drop() {
  for (auto& [tag, link] : links_) link->abort();
  links_.clear();
}

}  // namespace actorpipe
