// Replica reducer: one Gloo group per stage across the replicas, connected through the job's
// all-gather.
#include "actors/replica_reducer.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "actors/process_group.hpp"
#include "kernels/check.hpp"
#include "transport/gloo_group.hpp"

namespace actorpipe {

Expected<std::string> local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port > 0 ? port : 9);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    return make_error("address of {}: {}", host, ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(found, &::freeaddrinfo);
  const auto* to = reinterpret_cast<const sockaddr_in*>(found->ai_addr);
  if ((ntohl(to->sin_addr.s_addr) >> 24) == 127) return std::string("127.0.0.1");
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return make_error("a socket towards {}: {}", host, std::strerror(errno));
  sockaddr_in me{};
  socklen_t len = sizeof(me);
  const bool ok = ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return make_error("the local address towards {}: {}", host, std::strerror(err));
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &me.sin_addr, text, sizeof(text));
  return std::string(text);
}

Expected<std::unique_ptr<ReplicaReducer>> ReplicaReducer::connect(
    ProcessGroup& group, const std::vector<Placement>& replicas,
    std::chrono::milliseconds timeout) {
  AP_CHECK(!replicas.empty(), "no replicas");
  const int w = static_cast<int>(replicas.size());
  const int d = replicas.front().stages();
  std::unique_ptr<ReplicaReducer> out(new ReplicaReducer());
  out->replicas_ = w;
  out->groups_.resize(static_cast<size_t>(d));
  const ProcessGroupOptions& po = group.options();
  auto host = local_address_towards(po.coordinator_host, po.coordinator_port);
  if (!host) return make_error("replicas: {}", host.error().message);
  out->host_ = *host;
  const int me = group.rank();
  for (int s = 0; s < d; ++s) {
    std::vector<int> members;  // by replica
    int mine = -1;
    for (int q = 0; q < w; ++q) {
      members.push_back(replicas[static_cast<size_t>(q)].rank_of(s));
      if (members.back() == me) mine = q;
    }
    const std::string name = fmt::format("stage {}'s replicas", s);
    if (mine < 0) {  // not a member: this rank's part of the round is empty
      auto parts = group.all_gather({});
      if (!parts) return make_error("{}: {}", name, parts.error().message);
      continue;
    }
    GlooGroupOptions go;
    go.rank = mine;
    go.size = w;
    go.host = out->host_;
    go.timeout = timeout;
    go.name = name;
    auto exchange = [&](std::string text) -> Expected<std::vector<std::string>> {
      RankPart part;
      part.text = std::move(text);
      auto parts = group.all_gather(std::move(part));
      if (!parts) return parts.error();
      std::vector<std::string> texts;
      for (int rank : members) texts.push_back((*parts)[static_cast<size_t>(rank)].text);
      return texts;
    };
    auto g = GlooGroup::connect(go, exchange);
    if (!g) return g.error();
    out->groups_[static_cast<size_t>(s)] = std::move(*g);
  }
  return out;
}

ReplicaReducer::~ReplicaReducer() = default;

Status ReplicaReducer::all_reduce(int stage, long, std::span<float> data) {
  AP_CHECK(stage >= 0 && stage < static_cast<int>(groups_.size()) &&
               groups_[static_cast<size_t>(stage)] != nullptr,
           "stage {} is not run here", stage);
  return groups_[static_cast<size_t>(stage)]->all_reduce_sum(data);
}

int64_t ReplicaReducer::bytes_sent() const {
  int64_t sum = 0;
  for (const auto& g : groups_)
    if (g) sum += g->bytes_sent();
  return sum;
}

}  // namespace actorpipe
