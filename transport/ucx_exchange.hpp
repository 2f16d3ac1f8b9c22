// UCX exchange: every process of a job sends one byte buffer (possibly empty) to every other
// and receives one from each, over its UCX worker — how the state of layers that move between
// processes travels (actors/process_move.hpp). Rare and bulky, unlike the channels' stream of
// activations: buffers of any size, allocated on arrival.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "engine/expected.hpp"
#include "transport/ucx_worker.hpp"

namespace actorpipe {

/// Limits of one exchange.
struct UcxExchangeOptions {
  /// Every message must arrive within this bound (a lost peer ends the exchange with an error).
  std::chrono::milliseconds timeout{60000};
  /// The largest buffer a peer may announce; a larger one is refused before anything is
  /// allocated for it.
  uint64_t max_bytes = uint64_t{1} << 36;
};

/// The UCX tag of exchange round `round`'s message from rank `from`: its length (`payload`
/// false) or its bytes. Channel tag kUcxExchangeChannelTag; the sequence field holds the round
/// (31 bits), the kind (1 bit) and the sender's rank (16 bits).
uint64_t ucx_exchange_tag(uint32_t round, bool payload, int from);

/// One round: sends `outgoing[p]` (absent: an empty buffer) to every peer p of `peers` (rank ->
/// endpoint, every rank of the job but this one) and returns what each peer sent, by rank.
/// Every process of the job must call it with the same `round` (count rounds alike: a round's
/// messages match only that round) and each sends first, so no process waits for another to
/// post. Errors, naming the peer: a rank or round out of range, an announced length above
/// max_bytes, a message missing after the timeout (its receive is cancelled), a UCX failure.
Expected<std::map<int, std::vector<std::byte>>> ucx_exchange(
    UcxWorker& worker, int rank, const std::map<int, UcxEndpoint>& peers, uint32_t round,
    std::map<int, std::vector<std::byte>> outgoing, const UcxExchangeOptions& options = {});

}  // namespace actorpipe
