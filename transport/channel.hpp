// Tensor channel: a one-way path for tensors between two neighbouring stages. The sender posts a
// tensor and gets an Announcement; the receiver, given that announcement, takes the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "kernels/tensor.hpp"
#include "transport/wire.hpp"

namespace actorpipe {

/// What a channel carries.
///  activation       stage r -> r+1, a forward's output
///  gradient         stage r+1 -> r, a backward's input gradient
///  tied_to_owner    a tied parameter's gradient contribution, copy's shard -> owner's shard
///  tied_to_copy     the same, owner's shard -> copy's shard (gpipe, 1f1b exchange both ways)
///  tied_weights     a new version of a tied parameter, owner's shard -> copy's stage
///  tied_prediction  xpipe: a predicted tied value, owner's stage -> copy's stage
enum class ChannelKind : uint8_t {
  activation,
  gradient,
  tied_to_owner,
  tied_to_copy,
  tied_weights,
  tied_prediction,
};
std::string to_string(ChannelKind k);

/// The two ends of a channel: `from` posts, `to` receives (stage indices).
struct ChannelEnds {
  ChannelKind kind = ChannelKind::activation;
  int lower = 0;  ///< activation, gradient: the lower stage of the pair (lower, lower + 1)
  Direction direction = Direction::forward;
  int tied = -1;  ///< tied_*: the tied parameter's index (Model::tied() order)
  int from = 0;   ///< forward: lower; backward: lower + 1
  int to = 0;     ///< forward: lower + 1; backward: lower
  uint32_t tag = 0;
};

/// The ends of the channel for `dir` between `lower` and `lower + 1`.
ChannelEnds channel_ends(int lower, Direction dir);

/// Where the two copies of tied parameter k live: owner and copy stage (equal when one stage
/// holds both, which needs no channel).
struct TiedPair {
  int owner_stage = 0;
  int copy_stage = 0;
};

/// Every channel of a `stages`-stage pipeline in the one fixed order every participant computes
/// alike (the index is the tag): for lower = 0 .. stages-2 the activation then the gradient
/// channel (tags 2·lower, 2·lower + 1), then for each tied parameter held by two stages, in
/// order, its tied_to_owner, tied_to_copy, tied_weights and tied_prediction channels.
std::vector<ChannelEnds> channel_layout(int stages, const std::vector<TiedPair>& tied = {});

/// What the sending end of a channel between processes did with the tensors posted on it.
struct ChannelTraffic {
  uint64_t lent = 0;    ///< handed over in memory both processes map: no bytes copied
  uint64_t copied = 0;  ///< sent as bytes (a copy on each side)
  uint64_t copied_bytes = 0;
  ChannelTraffic& operator+=(const ChannelTraffic& o) {
    lent += o.lent;
    copied += o.copied;
    copied_bytes += o.copied_bytes;
    return *this;
  }
};

/// A one-way tensor channel. post() is called by the sending stage only and receive() by the
/// receiving stage only; the two may run on different threads at the same time. Implementations:
/// LocalChannel (in-process hand-off); UCX and NCCL channels (between processes and GPUs).
class TensorChannel {
 public:
  explicit TensorChannel(ChannelEnds ends) : ends_(ends) {}
  virtual ~TensorChannel() = default;
  TensorChannel(const TensorChannel&) = delete;
  TensorChannel& operator=(const TensorChannel&) = delete;

  const ChannelEnds& ends() const { return ends_; }

  /// Sender side: hands `tensor` to the channel and returns the announcement the receiver needs
  /// (sequence numbers 0, 1, 2, ... in post order). Never blocks. Errors: an undefined tensor.
  virtual Expected<Announcement> post(Tensor tensor, int64_t microbatch, int32_t version) = 0;

  /// Receiver side: takes the tensor that `a` announced. Errors (naming the announcement and
  /// what was expected): a tag of another channel, nothing posted under that sequence, or a
  /// payload whose microbatch, dtype or shape differ from the announcement.
  virtual Expected<Tensor> receive(const Announcement& a) = 0;

  /// Sender side: the memory to allocate the tensors one will post in, so that post() hands
  /// them over without copying their bytes (a UCX channel's shared arena between two processes
  /// of one host); nullptr when any memory does as well. It outlives every tensor in it.
  virtual BackendMemory* send_memory() { return nullptr; }

  /// Sender side of a channel between processes: the tensors posted so far, lent or copied
  /// (UCX channels count; in-process hand-offs and others report nothing).
  virtual ChannelTraffic traffic() const { return {}; }

  /// Tensors posted and not received yet.
  virtual size_t pending() const = 0;

  /// Drops every pending tensor (after a failure, so no storage outlives the run).
  virtual void clear() = 0;

  /// The process at the other end is lost: a receive() waiting for its payload ends now with an
  /// error naming `reason`, and later ones fail at once, until clear(). May be called from any
  /// thread. An in-process hand-off never waits, so by default this does nothing.
  virtual void interrupt(const std::string& reason) { (void)reason; }

  /// Sender side: whether post() also delivers its announcement to the receiving end (which
  /// hands it to its on_announcement handler), so the sender need not send it on the control
  /// plane. False for an in-process hand-off.
  virtual bool announces() const { return false; }

  /// Receiver side of a channel that announces(): `handler` gets every announcement as it
  /// arrives, in sequence order, on the channel's own thread (it must not block). Returns false
  /// when this channel does not carry announcements.
  using AnnouncementHandler = std::function<void(const Announcement&)>;
  virtual bool on_announcement(AnnouncementHandler handler) {
    (void)handler;
    return false;
  }

 private:
  ChannelEnds ends_;
};

/// What a thread that waits for a tensor from another process may do while it waits (a bounded
/// spin): drive the transport itself, so a payload or announcement that lands meanwhile reaches
/// it without waking the transport's own progress thread and then the waiting one. Between
/// begin_wait() and end_wait() the thread calls poll(); completions (announcement handlers
/// included) may then run on it. The UCX channels of a process share one (their worker).
class ChannelPoller {
 public:
  virtual ~ChannelPoller() = default;
  virtual void begin_wait() = 0;
  /// Progresses the transport once; whether anything happened.
  virtual bool poll() = 0;
  /// `idle`: the thread goes to sleep without what it waited for (the transport's own progress
  /// thread must take over now); otherwise it works on.
  virtual void end_wait(bool idle) = 0;
};

/// Every channel of a pipeline, created up front in the order of channel_layout(), so every
/// participant agrees on them without negotiation.
class ChannelSet {
 public:
  ChannelSet() = default;
  /// `channels` in the order of channel_layout(stages, ...): entry i has tag i (AP_CHECK
  /// otherwise, and on a null entry).
  ChannelSet(int stages, std::vector<std::unique_ptr<TensorChannel>> channels);
  /// The set as one process of a multi-process run sees it: entry i (tag i) is null where the
  /// process is no end of that channel. at(), forward(), backward() and tied() fail (AP_CHECK)
  /// there.
  static ChannelSet partial(int stages, std::vector<std::unique_ptr<TensorChannel>> channels);

  /// Number of stages the set was made for.
  int stages() const { return stages_; }
  size_t size() const { return channels_.size(); }
  /// Stage r -> r+1 (activations); r in [0, stages()-2].
  TensorChannel& forward(int r) const { return at(channel_tag(r, Direction::forward)); }
  /// Stage r+1 -> r (gradients); r in [0, stages()-2].
  TensorChannel& backward(int r) const { return at(channel_tag(r, Direction::backward)); }
  /// Tied parameter k's channel of `kind` (a tied_* kind; AP_CHECK when k has none or this
  /// process holds no end of it).
  TensorChannel& tied(int k, ChannelKind kind) const;
  /// send_memory() of channel `tag`, or of tied parameter k's channel of `kind`, where this
  /// process holds an end of it; else nullptr (any memory does).
  BackendMemory* send_memory(uint32_t tag) const;
  BackendMemory* tied_send_memory(int k, ChannelKind kind) const;
  /// The channel with tag `tag` (AP_CHECK on an unknown tag or one this process holds no end of).
  TensorChannel& at(uint32_t tag) const;
  /// Whether the set holds (an end of) channel `tag`.
  bool has(uint32_t tag) const { return tag < channels_.size() && channels_[tag] != nullptr; }
  /// Σ pending() over every channel held.
  size_t pending() const;
  /// Σ traffic() over every channel held.
  ChannelTraffic traffic() const;
  /// clear() on every channel held.
  void clear();
  /// interrupt(reason) on every channel held (a process of the run is lost).
  void interrupt(const std::string& reason);

  /// The transport a waiting stage drives itself (make_ucx_channels sets the UCX worker's);
  /// null where every channel is in-process.
  ChannelPoller* poller() const { return poller_.get(); }
  void set_poller(std::shared_ptr<ChannelPoller> poller) { poller_ = std::move(poller); }

 private:
  ChannelSet(int stages, std::vector<std::unique_ptr<TensorChannel>> channels, bool allow_missing);
  /// Tied parameter k's channel of `kind` where this process holds an end of it, else nullptr.
  TensorChannel* find_tied(int k, ChannelKind kind) const;

  int stages_ = 1;
  std::vector<std::unique_ptr<TensorChannel>> channels_;  // index = tag; null: not held
  std::shared_ptr<ChannelPoller> poller_;
};

}  // namespace actorpipe
