// UCX messenger: small messages between the processes of a job on their UCX workers — the
// control plane's path between ranks that is as fast as the channels' (shared memory on one
// host, TCP between hosts), where CAF's middleman costs a hop of 100 µs or more.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "transport/ucx_worker.hpp"

namespace actorpipe {

/// The channel tag of the messenger's UCX messages (no tensor channel takes it).
inline constexpr uint32_t kUcxMessengerChannelTag = 0x7FFE;
/// Ranks a messenger can tell apart (the sender's rank has 12 bits of the tag).
inline constexpr int kUcxMessengerMaxRanks = 1 << 12;

/// The UCX tag of message `sequence` (counted modulo 2^20 per sender and receiver) from rank
/// `from` on stream `stream` (16 bits): channel tag kUcxMessengerChannelTag, then the stream,
/// the sender's rank and the sequence in the 48 bits below.
uint64_t ucx_messenger_tag(uint32_t stream, int from, uint32_t sequence);

/// Options of a UcxMessenger.
struct UcxMessengerOptions {
  /// The longest message; send() refuses a longer one (the caller takes another path).
  size_t max_bytes = 16384;
};

/// Small messages to and from every peer rank of a job, in order per sender and receiver. Each
/// peer's messages are received by a UCX receive kept posted for the next one (exact tag: the
/// stream, the peer's rank, the sequence), so a message that arrives is handed on by whichever
/// thread progresses the worker — the progress thread, or one waiting in UcxWorker::poll() —
/// with no other thread woken. Messages of other streams (an earlier run's leftovers) never
/// match. All processes must create their messengers with the same stream; it carries no
/// authentication of its own: the peers are the job's ranks, whose worker addresses the job's
/// coordinator handed out.
class UcxMessenger {
 public:
  /// A message from rank `from`. Runs inside a UCX completion (see UcxCompletion): short, no
  /// blocking, no call back into the messenger or the worker.
  using Handler = std::function<void(int from, std::span<const std::byte> message)>;
  /// A receive from rank `from` failed (nothing more is received from it); same rules.
  using ErrorHandler = std::function<void(int from, const std::string& error)>;

  /// Posts a receive for each peer of `peers` (rank -> endpoint, ranks other than `rank`).
  /// Errors: no worker, a rank out of [0, kUcxMessengerMaxRanks), a peer equal to `rank`, a
  /// stream above 16 bits, max_bytes 0.
  static Expected<std::unique_ptr<UcxMessenger>> create(std::shared_ptr<UcxWorker> worker, int rank,
                                                        const std::map<int, UcxEndpoint>& peers,
                                                        uint32_t stream, Handler on_message,
                                                        ErrorHandler on_error,
                                                        UcxMessengerOptions options = {});
  /// Stops handing messages on (a completion running now finishes first), cancels the posted
  /// receives. Their buffers live on with the completions that UCX still owes.
  ~UcxMessenger();
  UcxMessenger(const UcxMessenger&) = delete;
  UcxMessenger& operator=(const UcxMessenger&) = delete;

  /// Sends a copy of `message` to rank `to`. Never blocks. Errors: an unknown rank, a message
  /// longer than max_bytes, an earlier send to `to` that failed (its UCX error).
  Status send(int to, std::span<const std::byte> message);

  int rank() const { return rank_; }
  uint32_t stream() const { return stream_; }
  size_t max_bytes() const { return opts_.max_bytes; }
  /// Messages handed to the handler so far (for tests).
  uint64_t delivered() const;

 private:
  struct State;
  struct Peer;
  UcxMessenger(std::shared_ptr<UcxWorker> worker, int rank, uint32_t stream,
               UcxMessengerOptions options);
  static void post(const std::shared_ptr<UcxWorker>& worker, const std::shared_ptr<State>& st,
                   int from);

  std::shared_ptr<UcxWorker> worker_;
  int rank_ = 0;
  uint32_t stream_ = 0;
  UcxMessengerOptions opts_;
  std::shared_ptr<State> state_;  // shared with the completions in flight
};

}  // namespace actorpipe
