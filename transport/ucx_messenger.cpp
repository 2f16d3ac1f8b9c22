// UCX messenger: one receive kept posted per peer for its next message; sends copy the message
// and start a tag send.
#include "transport/ucx_messenger.hpp"

#include <fmt/format.h>

#include <mutex>
#include <optional>
#include <utility>

#include "transport/ucx_channel.hpp"

namespace actorpipe {

namespace {

constexpr int kSequenceBits = 20;
constexpr uint32_t kSequenceMask = (uint32_t{1} << kSequenceBits) - 1;
constexpr int kRankBits = 12;
constexpr uint32_t kMaxStream = 0xFFFF;

}  // namespace

uint64_t ucx_messenger_tag(uint32_t stream, int from, uint32_t sequence) {
  const uint64_t field = (uint64_t{stream & kMaxStream} << (kRankBits + kSequenceBits)) |
                         (uint64_t{static_cast<uint32_t>(from)} << kSequenceBits) |
                         (sequence & kSequenceMask);
  return ucx_tag(kUcxMessengerChannelTag, field);
}

struct UcxMessenger::Peer {
  UcxEndpoint ep;
  uint32_t next_send = 0;
  std::optional<std::string> send_error;
  // the receive chain: one receive at a time, into `buffer`
  std::vector<std::byte> buffer;
  uint32_t next_receive = 0;
  uint64_t receive_op = 0;
};

/// What the completions in flight use; they may outlive the messenger.
struct UcxMessenger::State {
  std::mutex mu;  // guards everything below, and is held while the handler runs
  std::map<int, Peer> peers;
  Handler on_message;
  ErrorHandler on_error;
  uint32_t stream = 0;
  bool closed = false;
  std::atomic<uint64_t> delivered{0};
};

UcxMessenger::UcxMessenger(std::shared_ptr<UcxWorker> worker, int rank, uint32_t stream,
                           UcxMessengerOptions options)
    : worker_(std::move(worker)),
      rank_(rank),
      stream_(stream),
      opts_(options),
      state_(std::make_shared<State>()) {}

Expected<std::unique_ptr<UcxMessenger>> UcxMessenger::create(
    std::shared_ptr<UcxWorker> worker, int rank, const std::map<int, UcxEndpoint>& peers,
    uint32_t stream, Handler on_message, ErrorHandler on_error, UcxMessengerOptions options) {
  if (worker == nullptr) return make_error("UCX messenger: no UCX worker");
  if (rank < 0 || rank >= kUcxMessengerMaxRanks)
    return make_error("UCX messenger: rank {} is outside [0, {})", rank, kUcxMessengerMaxRanks);
  if (stream > kMaxStream)
    return make_error("UCX messenger: stream {} does not fit 16 bits", stream);
  if (options.max_bytes == 0) return make_error("UCX messenger: max_bytes = 0");
  std::unique_ptr<UcxMessenger> m(new UcxMessenger(worker, rank, stream, options));
  State& st = *m->state_;
  st.on_message = std::move(on_message);
  st.on_error = std::move(on_error);
  st.stream = stream;
  for (const auto& [peer, ep] : peers) {
    if (peer < 0 || peer >= kUcxMessengerMaxRanks || peer == rank)
      return make_error("UCX messenger of rank {}: peer rank {} is outside [0, {}) or its own",
                        rank, peer, kUcxMessengerMaxRanks);
    Peer& p = st.peers[peer];
    p.ep = ep;
    p.buffer.resize(options.max_bytes);
  }
  for (const auto& [peer, ep] : peers) post(m->worker_, m->state_, peer);
  return m;
}

void UcxMessenger::post(const std::shared_ptr<UcxWorker>& worker, const std::shared_ptr<State>& st,
                        int from) {
  std::byte* data = nullptr;
  size_t bytes = 0;
  uint32_t sequence = 0;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    if (st->closed) return;
    Peer& p = st->peers.at(from);
    data = p.buffer.data();
    bytes = p.buffer.size();
    sequence = p.next_receive;
  }
  std::weak_ptr<UcxWorker> weak = worker;
  const uint64_t op = worker->tag_recv(
      data, bytes, ucx_messenger_tag(st->stream, from, sequence),
      [st, weak, from, data](const Status& s, size_t length) {
        {
          std::lock_guard<std::mutex> lock(st->mu);
          if (st->closed) return;
          if (!s.ok()) {
            if (st->on_error)
              st->on_error(from, fmt::format("UCX messenger: a message from rank {}: {}", from,
                                             s.error().message));
            return;  // nothing more from this peer
          }
          Peer& p = st->peers.at(from);
          p.next_receive = (p.next_receive + 1) & kSequenceMask;
          st->delivered.fetch_add(1, std::memory_order_relaxed);
          if (st->on_message) st->on_message(from, std::span<const std::byte>(data, length));
        }
        if (auto w = weak.lock()) post(w, st, from);
      });
  bool cancel = false;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    Peer& p = st->peers.at(from);
    // the completion may have posted the next receive already: keep the newest
    if (p.next_receive == sequence) p.receive_op = op;
    cancel = st->closed;
  }
  if (cancel) worker->cancel(op);  // closed meanwhile: it must not take a later message
}

UcxMessenger::~UcxMessenger() {
  std::vector<uint64_t> ops;
  {
    std::lock_guard<std::mutex> lock(state_->mu);  // waits for a handler that runs now
    state_->closed = true;
    for (const auto& [peer, p] : state_->peers) ops.push_back(p.receive_op);
  }
  for (uint64_t op : ops) worker_->cancel(op);
}

Status UcxMessenger::send(int to, std::span<const std::byte> message) {
  if (message.size() > opts_.max_bytes) {
    return make_error("UCX messenger: a message of {} bytes to rank {} is longer than {}",
                      message.size(), to, opts_.max_bytes);
  }
  UcxEndpoint ep;
  uint32_t sequence = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->peers.find(to);
    if (it == state_->peers.end())
      return make_error("UCX messenger of rank {}: no peer rank {}", rank_, to);
    Peer& p = it->second;
    if (p.send_error) return make_error("{}", *p.send_error);
    ep = p.ep;
    sequence = p.next_send;
    p.next_send = (p.next_send + 1) & kSequenceMask;
  }
  auto copy = std::make_shared<std::vector<std::byte>>(message.begin(), message.end());
  worker_->tag_send(ep, copy->data(), copy->size(), ucx_messenger_tag(stream_, rank_, sequence),
                    [st = state_, copy, to](const Status& s, size_t) {
                      if (s.ok()) return;
                      std::lock_guard<std::mutex> lock(st->mu);
                      Peer& p = st->peers.at(to);
                      if (!p.send_error)
                        p.send_error = fmt::format("UCX messenger: a message to rank {} failed: {}",
                                                   to, s.error().message);
                    });
  return {};
}

uint64_t UcxMessenger::delivered() const {
  return state_->delivered.load(std::memory_order_relaxed);
}

}  // namespace actorpipe
