// UCX exchange: each peer gets the 8-byte length of its buffer and then (when not empty) the
// buffer, both sent at once; the receiving side takes every length first, allocates, then takes
// every buffer. The state the completions touch is shared with them, so a timed-out exchange
// leaves nothing dangling behind the sends UCX still holds.
#include "transport/ucx_exchange.hpp"

#include <fmt/format.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "transport/ucx_channel.hpp"

namespace actorpipe {
namespace {

constexpr int kMaxRank = 0xFFFF;
constexpr uint32_t kMaxRound = 0x7FFFFFFF;

struct ExchangeState {
  std::mutex mu;
  std::condition_variable cv;
  int pending = 0;                       // operations not completed
  std::set<int> waiting;                 // peers whose receive of the current phase is open
  std::string failure;                   // the first failure, "" if none
  std::map<int, uint64_t> sent_lengths;  // the lengths sent, alive until their sends complete
  std::map<int, std::vector<std::byte>> outgoing;
  std::map<int, uint64_t> lengths;  // received
  std::map<int, std::vector<std::byte>> incoming;
};

}  // namespace

uint64_t ucx_exchange_tag(uint32_t round, bool payload, int from) {
  const uint64_t seq = (uint64_t{round & kMaxRound} << 17) | (uint64_t{payload ? 1u : 0u} << 16) |
                       static_cast<uint64_t>(from & kMaxRank);
  return ucx_tag(kUcxExchangeChannelTag, seq);
}

Expected<std::map<int, std::vector<std::byte>>> ucx_exchange(
    UcxWorker& worker, int rank, const std::map<int, UcxEndpoint>& peers, uint32_t round,
    std::map<int, std::vector<std::byte>> outgoing, const UcxExchangeOptions& options) {
  if (rank < 0 || rank > kMaxRank)
    return make_error("UCX exchange: rank {} is outside [0, {}]", rank, kMaxRank);
  if (round > kMaxRound)
    return make_error("UCX exchange: round {} is above the largest, {}", round, kMaxRound);
  for (const auto& [p, ep] : peers) {
    if (p < 0 || p > kMaxRank || p == rank)
      return make_error("UCX exchange (rank {}): peer rank {} is not another rank in [0, {}]", rank,
                        p, kMaxRank);
  }
  for (const auto& [p, bytes] : outgoing) {
    if (!peers.count(p))
      return make_error("UCX exchange (rank {}): {} bytes for rank {}, which is not a peer", rank,
                        bytes.size(), p);
  }
  auto st = std::make_shared<ExchangeState>();
  st->outgoing = std::move(outgoing);
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;

  // sends: every peer's length, then its bytes
  for (const auto& [p, ep] : peers) {
    std::vector<std::byte>& bytes = st->outgoing[p];
    {
      std::lock_guard lock(st->mu);
      st->sent_lengths[p] = bytes.size();
      st->pending += bytes.empty() ? 1 : 2;
    }
    auto done = [st, p = p](const Status& s, size_t) {
      std::lock_guard lock(st->mu);
      if (!s && st->failure.empty())
        st->failure = fmt::format("sending to rank {}: {}", p, s.error().message);
      --st->pending;
      st->cv.notify_all();
    };
    worker.tag_send(ep, &st->sent_lengths[p], sizeof(uint64_t),
                    ucx_exchange_tag(round, false, rank), done);
    if (!bytes.empty())
      worker.tag_send(ep, bytes.data(), bytes.size(), ucx_exchange_tag(round, true, rank), done);
  }

  // receives, in two phases; waits until every receive of the phase is in (and, in the last,
  // every send is done), or fails
  std::map<int, uint64_t> ops;
  auto wait_phase = [&](const char* what) -> Status {
    std::unique_lock lock(st->mu);
    const bool done = st->cv.wait_until(
        lock, deadline, [&] { return !st->failure.empty() || st->waiting.empty(); });
    if (done && st->failure.empty()) return {};
    std::string why = st->failure;
    std::set<int> missing = st->waiting;
    lock.unlock();
    for (int p : missing) worker.cancel(ops[p]);
    if (why.empty()) {
      std::string who;
      for (int p : missing) who += fmt::format("{}{}", who.empty() ? "" : ", ", p);
      why = fmt::format("no {} from rank(s) {} within {} ms", what, who, options.timeout.count());
    }
    return make_error("UCX exchange round {} (rank {}): {}", round, rank, why);
  };
  auto receive = [&](int p, void* data, size_t bytes, bool payload) {
    {
      std::lock_guard lock(st->mu);
      st->waiting.insert(p);
    }
    ops[p] = worker.tag_recv(
        data, bytes, ucx_exchange_tag(round, payload, p),
        [st, p, bytes](const Status& s, size_t length) {
          std::lock_guard lock(st->mu);
          if (st->failure.empty()) {
            if (!s)
              st->failure = fmt::format("receiving from rank {}: {}", p, s.error().message);
            else if (length != bytes)
              st->failure =
                  fmt::format("rank {} sent {} bytes where {} were announced", p, length, bytes);
          }
          st->waiting.erase(p);
          st->cv.notify_all();
        });
  };
  for (const auto& [p, ep] : peers) {
    uint64_t* slot = nullptr;
    {
      std::lock_guard lock(st->mu);
      slot = &st->lengths[p];
    }
    receive(p, slot, sizeof(uint64_t), false);
  }
  if (Status ok = wait_phase("length"); !ok) return ok.error();
  for (const auto& [p, ep] : peers) {
    const uint64_t n = st->lengths[p];
    if (n > options.max_bytes) {
      return make_error(
          "UCX exchange round {} (rank {}): rank {} announced {} bytes, above the limit of {}",
          round, rank, p, n, options.max_bytes);
    }
    std::vector<std::byte>* into = nullptr;
    {
      std::lock_guard lock(st->mu);
      into = &st->incoming[p];
    }
    into->resize(static_cast<size_t>(n));
    if (n > 0) receive(p, into->data(), into->size(), true);
  }
  if (Status ok = wait_phase("bytes"); !ok) return ok.error();
  // the sends: delivered once the peers have their bytes, but UCX may report it a little later
  {
    std::unique_lock lock(st->mu);
    st->cv.wait_until(lock, deadline, [&] { return !st->failure.empty() || st->pending == 0; });
    if (!st->failure.empty())
      return make_error("UCX exchange round {} (rank {}): {}", round, rank, st->failure);
    if (st->pending > 0)
      return make_error("UCX exchange round {} (rank {}): {} send(s) not completed within {} ms",
                        round, rank, st->pending, options.timeout.count());
  }
  return std::move(st->incoming);
}

}  // namespace actorpipe
