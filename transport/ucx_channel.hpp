// UCX channel: one end (sender or receiver) of a tensor channel whose two stages live in different
// processes. Payloads move by UCX tag send/recv; announcements travel on the control plane.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/channel.hpp"
#include "transport/ucx_shared_arena.hpp"
#include "transport/ucx_worker.hpp"

namespace actorpipe {

/// Bits of a UCX tag that carry the sequence number; the channel tag takes the 16 above them.
inline constexpr int kUcxSequenceBits = 48;
/// The largest sequence number a UCX tag can carry.
inline constexpr uint64_t kUcxMaxSequence = (uint64_t{1} << kUcxSequenceBits) - 1;
/// The largest channel tag a UCX tag can carry (a pipeline of up to 32768 stages).
inline constexpr uint32_t kUcxMaxChannelTag = 0xFFFF;

/// The UCX tag of payload `sequence` on channel `channel_tag`: channel tag in bits 63..48,
/// sequence number in bits 47..0. The receiver matches all 64 bits.
constexpr uint64_t ucx_tag(uint32_t channel_tag, uint64_t sequence) {
  return (uint64_t{channel_tag} << kUcxSequenceBits) | (sequence & kUcxMaxSequence);
}

/// The bit of a channel tag that marks a UCX message as an announcement (carry_announcements)
/// rather than a payload: such channels have tags below it.
inline constexpr uint32_t kUcxAnnouncementTagBit = 0x8000;

/// The bit of a channel tag that marks a UCX message as a receiver handing a lent tensor back
/// (shared_memory): such channels have tags below kUcxSharedMaxChannelTag.
inline constexpr uint32_t kUcxReleaseTagBit = 0x4000;
/// Channels with a tag from here on send by copy (their release tags would reach the tags
/// below, which other messages use).
inline constexpr uint32_t kUcxSharedMaxChannelTag = 0x3F00;

/// What follows the Announcement in the message that announces a lent tensor (shared_memory),
/// then key_bytes of the chunk's packed key the first time the chunk is used.
struct UcxLentHeader {
  static constexpr uint64_t kMagic = 0x31746E656C7061ULL;  // "aplent1"
  uint64_t magic = kMagic;
  uint32_t chunk = 0;  ///< of the sender's UcxSharedArena
  uint32_t key_bytes = 0;
  uint64_t offset = 0;  ///< of the payload in the chunk, in bytes
  uint64_t chunk_address = 0;
  uint64_t chunk_length = 0;
};
/// The longest packed key a lent announcement carries.
inline constexpr size_t kUcxMaxKeyBytes = 1024;

/// The channel tag that ucx_exchange's messages use (transport/ucx_exchange.hpp): no channel
/// takes it.
inline constexpr uint32_t kUcxExchangeChannelTag = 0x7FFF;

/// Options of a UcxChannel.
struct UcxChannelOptions {
  /// post() also sends the announcement (its bytes, tagged with kUcxAnnouncementTagBit) right
  /// after the payload, and the receiving end hands each one to its on_announcement handler:
  /// the control plane then carries no announcement for this channel. Both ends must agree.
  bool carry_announcements = false;
  /// With carry_announcements: the sending end allocates a UcxSharedArena (send_memory()) that
  /// the receiving process maps, and a tensor posted from it is lent, not copied: only its
  /// announcement travels, with where the bytes lie (and, the first time, the chunk's packed
  /// key); the receiver's tensor views the sender's memory in place and hands it back (a
  /// message with kUcxReleaseTagBit) when its last holder drops it, and only then may the
  /// sender reuse it. Tensors from elsewhere, and every tensor when the peer cannot map this
  /// process's memory (another host, UCX_TLS without shared memory), go by copy as before.
  /// Both ends must agree; the receiving end needs the endpoint to the sender.
  bool shared_memory = false;
  /// The arena's chunk size (UcxSharedArena).
  size_t shared_chunk_bytes = UcxSharedArena::kDefaultChunkBytes;
  /// receive() fails after waiting this long for the payload, so a vanished peer never hangs it.
  std::chrono::milliseconds receive_timeout{60000};
  /// receive() polls for the payload (yielding its core) this long before it sleeps: a
  /// payload that lands meanwhile costs no wake-up of the receiving thread.
  std::chrono::microseconds spin_before_wait{50};
  /// Buffers kept for reuse (the receiver's receive buffers; the sender's host copies of device
  /// tensors); beyond that, buffers are allocated per receive or post.
  int pool_capacity = 8;
};

/// One end of a channel between processes. The sender end's post() starts a tag send of the
/// tensor's bytes and keeps the tensor (its storage) until the send completes; it never blocks.
/// The receiver end's receive() posts a tag receive for exactly that channel and sequence into a
/// pooled buffer (reused once every Tensor handed out on it is gone), polls for spin_before_wait
/// and then sleeps,
/// checks the length and returns the buffer as a Tensor of the announced dtype and shape.
/// Receives may come in any order: UCX matches each by its tag. post() on a receiver end and
/// receive() on a sender end are programmer errors (AP_CHECK).
class UcxChannel final : public TensorChannel {
 public:
  enum class End : uint8_t { sender, receiver };

  /// The sending end of `ends`; payloads go to `peer`, the endpoint of the receiving process.
  static std::unique_ptr<UcxChannel> sender(std::shared_ptr<UcxWorker> worker, ChannelEnds ends,
                                            UcxEndpoint peer, UcxChannelOptions options = {});
  /// The receiving end of `ends`; `peer` (the endpoint of the sending process) is where lent
  /// tensors go back (shared_memory).
  static std::unique_ptr<UcxChannel> receiver(std::shared_ptr<UcxWorker> worker, ChannelEnds ends,
                                              UcxChannelOptions options = {},
                                              UcxEndpoint peer = {});
  ~UcxChannel() override;

  End end() const { return end_; }
  const UcxChannelOptions& options() const { return opts_; }

  /// Sender: starts the send and returns the announcement. A tensor in a device's memory (not
  /// host_readable) is copied into a pooled host buffer first and sent from there (host-staged).
  /// Errors: an undefined tensor, an earlier send of this channel that failed (its message).
  Expected<Announcement> post(Tensor tensor, int64_t microbatch, int32_t version) override;

  /// Receiver: the payload `a` announced. Errors (naming the channel and the announcement): a tag
  /// of another channel, a bad dtype or shape, no payload within receive_timeout, a payload of
  /// another length, a UCX failure.
  Expected<Tensor> receive(const Announcement& a) override;

  /// Sender with shared_memory: the arena tensors are lent from, when the peer can map it;
  /// nullptr otherwise (shared_memory_note() says why).
  BackendMemory* send_memory() override;
  /// Sender with shared_memory: why it sends by copy ("" when it lends).
  const std::string& shared_memory_note() const { return shared_note_; }
  /// Sender: tensors lent and not handed back yet.
  size_t lent() const;
  /// Sender: tensors posted so far, lent or copied.
  ChannelTraffic traffic() const override;

  /// Sender: sends not completed yet. Receiver: receives that timed out and that UCX still holds.
  size_t pending() const override;

  /// Forgets what pending() counts (after a failure): pending() is 0 afterwards. Receives are
  /// cancelled; sends cannot be, so UCX keeps their tensors until they complete or the worker
  /// closes the endpoint. Lent tensors are dropped (a receiver that still reads one reads
  /// memory the sender may reuse: only after a failure, whose results nobody keeps).
  void clear() override;

  /// Receiver: a receive() waiting for its payload ends now with `reason` (its UCX receive is
  /// cancelled, and counted by pending() until UCX hands its buffer back), later ones fail at
  /// once, until clear(). Sender: nothing (a send never waits).
  void interrupt(const std::string& reason) override;

  /// Sender: whether post() delivers the announcement itself (carry_announcements).
  bool announces() const override;

  /// Receiver with carry_announcements: `handler` gets announcement 0, 1, 2, ... as each
  /// arrives, on the UCX worker's progress thread; until clear() or destruction. False otherwise
  /// (or on the sending end).
  bool on_announcement(AnnouncementHandler handler) override;

  /// Sender: waits (without spinning) until every send completed. Errors: a send that failed,
  /// sends still pending after `timeout`.
  Status wait_sent(std::chrono::milliseconds timeout);

  /// Receiver: allocates `count` receive buffers for `dtype` tensors of `shape` up front (within
  /// pool_capacity).
  void reserve(DType dtype, const std::vector<int64_t>& shape, int count);

  /// Buffers in the pool (the receiver's; the sender's host-staging ones).
  size_t pool_size() const;

 private:
  struct State;
  UcxChannel(std::shared_ptr<UcxWorker> worker, ChannelEnds ends, End end, UcxEndpoint peer,
             UcxChannelOptions options);
  std::string name() const;
  /// Posts the receive of announcement `sequence`; its completion hands it to the handler and
  /// posts the next one, until clear().
  static void receive_announcement(const std::shared_ptr<UcxWorker>& worker,
                                   const std::shared_ptr<State>& st, uint32_t tag,
                                   uint64_t sequence);
  Tensor acquire(DType dtype, const std::vector<int64_t>& shape, size_t bytes);
  /// Receiver: records the lent payload that the announcement message `msg` (`length` bytes,
  /// longer than an Announcement) describes, or what is wrong with it. Under State::mu.
  static void note_lent(State& st, const Announcement& a, const std::vector<std::byte>& msg,
                        size_t length);
  /// Sender: lends `tensor` (in the arena at `place`) under announcement `a`.
  void lend(Tensor tensor, const Announcement& a, UcxSharedPlace place, uint64_t generation);
  /// Receiver: the lent payload of `a` as a tensor viewing the sender's memory.
  struct LentPayload;
  Expected<Tensor> receive_lent(const Announcement& a, size_t bytes, const LentPayload& lent);

  std::shared_ptr<UcxWorker> worker_;
  End end_;
  UcxEndpoint peer_;
  UcxChannelOptions opts_;
  std::shared_ptr<State> state_;  // shared with the completions of operations in flight
  mutable std::mutex recv_mu_;    // one receive (or host-staging post) at a time; guards pool_
  std::vector<std::shared_ptr<Storage>> pool_;
  std::shared_ptr<UcxSharedArena> arena_;  // sender with shared_memory, when the peer maps it
  std::string shared_note_;
  struct Attached;  // receiver: a chunk of the sender's arena mapped here (under recv_mu_)
  std::map<uint32_t, std::shared_ptr<Attached>> attached_;
};

/// What one process needs to build its channels: where every stage runs, which rank it is, its
/// worker and an endpoint to each rank it exchanges tensors with.
struct UcxChannelPlan {
  std::vector<int> rank_of_stage;  ///< stage -> rank; its size is the number of stages
  std::vector<TiedPair> tied;      ///< where each tied parameter's copies live (channel_layout)
  int rank = 0;
  std::shared_ptr<UcxWorker> worker;
  std::map<int, UcxEndpoint> peers;  ///< rank -> endpoint
  UcxChannelOptions options;
  /// For a channel between this process and another: an end to use instead of UCX's (the NCCL
  /// channel between GPU stages, actors/gpu_links.hpp); unset, or null returned: UCX's.
  std::function<std::unique_ptr<TensorChannel>(const ChannelEnds&)> between_processes;
};

/// The channels of process `plan.rank`, in the fixed order of ChannelSet (with
/// plan.options.carry_announcements, every UCX channel carries its announcements, the tied
/// parameters' too): a LocalChannel where the rank holds both stages, a UcxChannel end (or
/// plan.between_processes's) where it holds one, none where it holds neither
/// (ChannelSet::partial). Errors: no stages, a negative
/// rank, no worker or no endpoint for a rank that a channel of this process leads to.
Expected<ChannelSet> make_ucx_channels(const UcxChannelPlan& plan);

}  // namespace actorpipe
