// Gloo group: the data-parallel replicas of one pipeline stage, connected over Gloo's TCP
// transport, summing their gradients with a deterministic all-reduce (the same bits everywhere).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/expected.hpp"

namespace actorpipe {

/// How the members of a group meet: each member gives one text (its Gloo addresses) and gets every
/// member's text, in member order (element r is member r's). Every member calls it exactly once
/// per GlooGroup::connect, also in a group of one (not when its options are invalid). The texts
/// are printable ASCII lines.
using AllGatherText = std::function<Expected<std::vector<std::string>>(std::string mine)>;

/// Options of a GlooGroup; every member passes the same size, timeout and name.
struct GlooGroupOptions {
  int rank = 0;                    ///< this member, 0 .. size-1
  int size = 1;                    ///< members
  std::string host = "127.0.0.1";  ///< address this member's TCP device binds and is reached at
  std::chrono::milliseconds timeout{60000};  ///< connect, and each collective
  std::string name = "gloo group";           ///< names the group in errors ("stage 1's replicas")
};

/// One member of a group of `size` processes (or threads) joined by Gloo's TCP transport: a full
/// mesh of size-1 TCP connections and one Gloo event-loop thread per member (none in a group of
/// one). Calls of all_reduce_sum on one group must not overlap; rank(), size() and bytes_sent()
/// may be called from any thread. Destroying a member closes its connections: the other members'
/// collectives in flight or later then fail.
class GlooGroup {
 public:
  /// Connects this member to the others: creates its TCP device on options.host, hands its
  /// addresses (and its host name) to `exchange` once, connects to every other member. Errors
  /// (naming options.name and the rank): a size below 1, a rank outside 0 .. size-1, a timeout
  /// that is not positive, a failed exchange, an exchange that returns another number of texts
  /// than size or a text that is not a member's of this group, Gloo's errors (a host it cannot
  /// bind, a peer not connected within options.timeout). Invalid options return before
  /// `exchange` is called.
  static Expected<std::unique_ptr<GlooGroup>> connect(const GlooGroupOptions& options,
                                                      const AllGatherText& exchange);
  ~GlooGroup();
  GlooGroup(const GlooGroup&) = delete;
  GlooGroup& operator=(const GlooGroup&) = delete;

  int rank() const;
  int size() const;
  const std::string& name() const;

  /// data <- sum over members r = 0..size-1 of member r's data, element-wise, added in member
  /// order starting from member 0's value (((d0 + d1) + d2) + ..., float adds): the same bits on
  /// every member and the same as that serial loop. Every member calls it with the same size, in
  /// the same order. One member, or no elements: no-op (nothing is sent).
  /// How: data is padded with zeros to size chunks of c = ceil(n/size) elements; gloo::alltoall
  /// gives member j every member's chunk j, which it sums in member order; gloo::allgather hands
  /// every member every summed chunk. Scratch buffers (2 size c floats) grow and are kept; a call
  /// of the same length as the one before allocates nothing here.
  /// Errors (naming the group, this rank, the call's length and Gloo's cause): a peer that does
  /// not take part within options.timeout, a closed connection, an earlier error: after one, the
  /// group is unusable and every later call returns an error at once. On error, data is left as
  /// it was.
  Status all_reduce_sum(std::span<float> data);

  /// Bytes this member sent in its all_reduce_sum calls so far (for benchmarks): payload only,
  /// 2 (size-1) c sizeof(float) per call that communicates (size-1 chunks in the alltoall, size-1
  /// in the allgather ring).
  int64_t bytes_sent() const;

 private:
  struct Impl;
  explicit GlooGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace actorpipe
