// NCCL channel: one end of a tensor channel between two processes whose stages both compute on
// GPUs. Payloads move GPU memory to GPU memory by NCCL send/recv on a two-rank communicator of
// the channel's own (an NcclLink); announcements travel on the control plane. Built when the
// build has CUDA (ACTORPIPE_CUDA); otherwise every entry point is an error that says so.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/backend_memory.hpp"
#include "transport/channel.hpp"

namespace actorpipe {

/// Empty when this build can make NCCL links (it has CUDA and NCCL), else why not.
std::string nccl_unavailable_reason();

/// A fresh NCCL unique id, as text (hex) for the coordinator to hand to the other end: the
/// process that makes it hosts the communicator's rendezvous until the link is made. Needs no
/// GPU. Errors: no NCCL in this build, NCCL's own failure.
Expected<std::string> nccl_unique_id();

/// The two-rank NCCL communicator of one channel: rank 0 its sending end, rank 1 its receiving
/// end, each on its stage's GPU. Made with a timeout (a non-blocking communicator polled), and
/// warmed up (one byte sent) so that the first payload waits for no connection. Shared by the
/// channel ends of successive runs; abort() ends it for good (a failed run), and dead() then
/// tells the owner to make another.
class NcclLink {
 public:
  /// Joins the link of unique id `id` (nccl_unique_id's text, the same at both ends) as its
  /// sender (rank 0) or receiver (rank 1) on the GPU of `memory` (a CUDA memory: the stage's
  /// lasting memory, whose allocations tell the device). Blocks until the other end joined and
  /// the warm-up byte went across, at most `timeout`. Errors: no NCCL in this build, memory not
  /// on a GPU, a malformed id, NCCL's failure, the timeout.
  static Expected<std::shared_ptr<NcclLink>> connect(const std::string& id, bool sender,
                                                     BackendMemory& memory,
                                                     std::chrono::milliseconds timeout);
  ~NcclLink();
  NcclLink(const NcclLink&) = delete;
  NcclLink& operator=(const NcclLink&) = delete;

  bool sender() const { return sender_; }
  int device() const { return device_; }
  BackendMemory& memory() const { return *memory_; }
  /// Whether abort() ended it.
  bool dead() const { return dead_.load(); }
  /// Ends the communicator now (operations in flight are abandoned): after a failure, on a
  /// thread that no channel end of the link is using at the same time. Idempotent.
  void abort();

 private:
  friend class NcclChannel;
  struct Handles;  // the communicator and the stream (CUDA and NCCL types stay in the source)
  NcclLink(bool sender, int device, BackendMemory& memory, std::unique_ptr<Handles> h);

  bool sender_;
  int device_;
  BackendMemory* memory_;
  std::unique_ptr<Handles> h_;
  std::atomic<bool> dead_{false};
  std::mutex abort_mu_;
};

/// Options of an NcclChannel.
struct NcclChannelOptions {
  /// receive() fails after waiting this long for the payload, so a vanished peer never hangs it.
  std::chrono::milliseconds receive_timeout{60000};
  /// Receive buffers kept for reuse (beyond that, one is allocated per receive).
  int pool_capacity = 8;
};

/// One end of a channel over an NcclLink. Payloads are the tensors' bytes (bit for bit, any
/// dtype). The sender's post() takes a tensor on its GPU whose writer synchronised (a stage's
/// output), or a host tensor (copied to the GPU first); it enqueues the send on the link's
/// stream, keeps the tensor until the send completes and never waits for the receiver. The
/// receiver's receive() takes payloads in post order (NCCL matches sends and receives in order:
/// announcement k must be the k-th received), into a pooled buffer of the GPU's lasting memory,
/// and returns once it is there. announces() is false: the announcements go on the control plane.
class NcclChannel final : public TensorChannel {
 public:
  static std::unique_ptr<NcclChannel> sender(std::shared_ptr<NcclLink> link, ChannelEnds ends,
                                             NcclChannelOptions options = {});
  static std::unique_ptr<NcclChannel> receiver(std::shared_ptr<NcclLink> link, ChannelEnds ends,
                                               NcclChannelOptions options = {});
  ~NcclChannel() override;

  /// Sender: enqueues the send and returns the announcement. Errors: an undefined tensor, a
  /// tensor on another GPU, a dead link, NCCL's failure.
  Expected<Announcement> post(Tensor tensor, int64_t microbatch, int32_t version) override;
  /// Receiver: the payload `a` announced. Errors (naming the channel and the announcement): a
  /// tag of another channel, a sequence out of post order, a bad dtype or shape, no payload
  /// within receive_timeout, an interrupt, a dead link, NCCL's failure. A receive that fails
  /// aborts the link (NCCL cannot cancel it).
  Expected<Tensor> receive(const Announcement& a) override;
  /// Sender: sends not completed yet. Receiver: 0.
  size_t pending() const override;
  /// Sender: waits (bounded, 1 s) for the sends in flight; those still pending then are
  /// abandoned with the link (aborted). Receiver: nothing to forget. pending() is 0 afterwards.
  void clear() override;
  /// Receiver: a receive() waiting for its payload ends now with `reason` (aborting the link on
  /// its own thread), and so do later ones until clear(). Sender: nothing.
  void interrupt(const std::string& reason) override;

  /// Receiver: buffers in the pool.
  size_t pool_size() const;

 private:
  struct InFlight;
  NcclChannel(std::shared_ptr<NcclLink> link, ChannelEnds ends, NcclChannelOptions options);
  std::string name() const;
  // sender: forgets the sends that completed; how many remain
  size_t reap() const;

  std::shared_ptr<NcclLink> link_;
  NcclChannelOptions opts_;
  uint64_t next_sequence_ = 0;  // sender: the next post's; receiver: the next receive's
  mutable std::mutex mu_;
  mutable std::deque<std::unique_ptr<InFlight>> in_flight_;  // sender: oldest first
  std::vector<Tensor> pool_;                                 // receiver
  std::string interrupt_reason() const;
  std::atomic<bool> interrupted_{false};
  mutable std::mutex reason_mu_;  // guards interrupt_reason_ (interrupt() runs while mu_ is held)
  std::string interrupt_reason_;
};

}  // namespace actorpipe
