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
#include <map>

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

// One stage's group and the thread that runs its all-reduces, one at a time, in order.
struct ReplicaReducer::Lane {
  struct Job {
    long step = 0;
    std::span<float> data;
  };
  int stage = 0;
  std::unique_ptr<GlooGroup> group;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> queue;
  bool busy = false;  // the thread runs a job
  bool stop = false;
  std::string error;  // the first failure: every later call fails with it
  // per update whose pieces were posted and not yet asked for: floats posted, jobs not done
  std::map<long, size_t> posted;
  std::map<long, int> unfinished;
  std::vector<Call> calls;  // done, not yet taken
  std::thread thread;

  void run() {
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stopped, nothing left
      Job job = queue.front();
      queue.pop_front();
      busy = true;
      const bool failed = !error.empty();
      lock.unlock();
      Call c;
      c.stage = stage;
      c.step = job.step;
      c.floats = static_cast<int64_t>(job.data.size());
      c.start = std::chrono::steady_clock::now();
      Status ok = failed ? Status{} : group->all_reduce_sum(job.data);
      c.end = std::chrono::steady_clock::now();
      lock.lock();
      if (!ok && error.empty()) error = ok.error().message;
      if (!failed) calls.push_back(c);
      if (auto it = unfinished.find(job.step); it != unfinished.end()) --it->second;
      busy = false;
      cv.notify_all();
    }
  }
  // Waits until the posted pieces of update `step` ran (the lock held).
  void drain_step(std::unique_lock<std::mutex>& lock, long step) {
    cv.wait(lock, [&] { return unfinished[step] == 0 || !error.empty(); });
  }
};

Expected<std::unique_ptr<ReplicaReducer>> ReplicaReducer::connect(
    ProcessGroup& group, const std::vector<Placement>& replicas,
    std::chrono::milliseconds timeout) {
  AP_CHECK(!replicas.empty(), "no replicas");
  const int w = static_cast<int>(replicas.size());
  const int d = replicas.front().stages();
  std::unique_ptr<ReplicaReducer> out(new ReplicaReducer());
  out->replicas_ = w;
  out->lanes_.resize(static_cast<size_t>(d));
  out->members_.resize(static_cast<size_t>(d));
  out->group_ = &group;
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
    out->members_[static_cast<size_t>(s)] = members;
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
    auto lane = std::make_unique<Lane>();
    lane->stage = s;
    lane->group = std::move(*g);
    Lane* l = lane.get();
    lane->thread = std::thread([l] { l->run(); });
    out->lanes_[static_cast<size_t>(s)] = std::move(lane);
  }
  return out;
}

ReplicaReducer::~ReplicaReducer() {
  for (auto& l : lanes_) {
    if (!l) continue;
    {
      std::lock_guard lock(l->mu);
      l->stop = true;
    }
    l->cv.notify_all();
    l->thread.join();
  }
}

ReplicaReducer::Lane* ReplicaReducer::lane(int stage) {
  AP_CHECK(stage >= 0 && stage < static_cast<int>(lanes_.size()) &&
               lanes_[static_cast<size_t>(stage)] != nullptr,
           "stage {} is not run here", stage);
  return lanes_[static_cast<size_t>(stage)].get();
}

bool ReplicaReducer::post(int stage, long step, std::span<float> part) {
  Lane& l = *lane(stage);
  {
    std::lock_guard lock(l.mu);
    if (!l.error.empty()) return false;
    l.posted[step] += part.size();
    ++l.unfinished[step];
    l.queue.push_back({step, part});
  }
  l.cv.notify_all();
  return true;
}

namespace {

// The error of a failed all-reduce, after letting go of the lane (naming its cause may wait).
template <class Reducer>
Status fail_unlocked(Reducer& r, std::unique_lock<std::mutex>& lock, int stage,
                     const std::string& error) {
  const std::string copy = error;
  lock.unlock();
  return make_error("{}", r.failure(stage, copy));
}

}  // namespace

Status ReplicaReducer::all_reduce(int stage, long step, std::span<float> data) {
  Lane& l = *lane(stage);
  std::unique_lock lock(l.mu);
  if (auto it = l.posted.find(step); it != l.posted.end()) {
    // summed in pieces while the backward went on: wait for the last of them
    const size_t floats = it->second;
    l.posted.erase(it);
    l.drain_step(lock, step);
    l.unfinished.erase(step);
    if (!l.error.empty()) return fail_unlocked(*this, lock, stage, l.error);
    if (floats != data.size()) {
      return make_error("stage {}: update {} was summed in pieces covering {} of its {} gradients",
                        stage, step, floats, data.size());
    }
    return {};
  }
  if (!l.error.empty()) return fail_unlocked(*this, lock, stage, l.error);
  ++l.unfinished[step];
  l.queue.push_back({step, data});
  l.cv.notify_all();
  l.drain_step(lock, step);
  l.unfinished.erase(step);
  if (!l.error.empty()) return fail_unlocked(*this, lock, stage, l.error);
  return {};
}

std::string ReplicaReducer::failure(int stage, const std::string& gloo) {
  const std::string what = fmt::format("the gradient sum over the replicas (ranks {}) failed: {}",
                                       fmt::join(members_[static_cast<size_t>(stage)], ", "), gloo);
  const auto until = std::chrono::steady_clock::now() +
                     std::min<std::chrono::milliseconds>(group_->options().peer_timeout,
                                                         std::chrono::milliseconds(3000));
  while (std::chrono::steady_clock::now() < until) {
    if (auto lost = group_->lost()) {
      // "rank 2: reason" -> "rank 2 was lost (reason)"
      const size_t colon = lost->find(": ");
      if (colon == std::string::npos) return fmt::format("{}; then {}", *lost, what);
      return fmt::format("{} was lost ({}); then {}", lost->substr(0, colon),
                         lost->substr(colon + 2), what);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return what;
}

std::vector<ReplicaReducer::Call> ReplicaReducer::take_calls() {
  std::vector<Call> out;
  for (auto& l : lanes_) {
    if (!l) continue;
    std::lock_guard lock(l->mu);
    out.insert(out.end(), l->calls.begin(), l->calls.end());
    l->calls.clear();
  }
  return out;
}

int64_t ReplicaReducer::bytes_sent() const {
  int64_t sum = 0;
  for (const auto& l : lanes_)
    if (l) sum += l->group->bytes_sent();
  return sum;
}

}  // namespace actorpipe
