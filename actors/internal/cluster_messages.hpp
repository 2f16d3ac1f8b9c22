// Messages of the job coordinator: the atoms ranks, watchers and the coordinator exchange, and
// the error category of the coordinator's refusals (its context is one readable string).
#pragma once

#include <caf/atom.hpp>
#include <cstdint>

namespace actorpipe::internal {

// rank -> coordinator
using join_atom = caf::atom_constant<caf::atom("join")>;    // (string secret, RankInfo) -> JobTable
using table_atom = caf::atom_constant<caf::atom("table")>;  // () -> JobTable, admitted nodes only
// watcher -> coordinator: subscribe to rank losses (admitted nodes only)
using watch_atom = caf::atom_constant<caf::atom("watch")>;
// coordinator -> watchers
using rank_lost_atom = caf::atom_constant<caf::atom("rank_lost")>;  // (int rank, string reason)
// coordinator -> itself: the join window closes
using deadline_atom = caf::atom_constant<caf::atom("deadline")>;

/// Category of the coordinator's errors (caf::error's category atom).
constexpr caf::atom_value coordinator_error_category = caf::atom("coord");

/// Why the coordinator refused a message (caf::error's code).
enum class CoordinatorErrc : uint8_t {
  not_admitted = 1,  ///< the sender's node has not joined with the secret
  wrong_secret = 2,  ///< missing or wrong job secret
  bad_rank = 3,      ///< outside [0, world), already joined, or announces no actor
  join_closed = 4,   ///< the join timeout passed, or all ranks are already in
  incomplete = 5,    ///< the table is asked for before every rank joined
  join_timeout = 6,  ///< the answer to the joins pending when the timeout passed
};

/// Text of a code, for rendering the coordinator's errors.
constexpr const char* to_string(CoordinatorErrc x) {
  switch (x) {
    case CoordinatorErrc::not_admitted:
      return "not_admitted";
    case CoordinatorErrc::wrong_secret:
      return "wrong_secret";
    case CoordinatorErrc::bad_rank:
      return "bad_rank";
    case CoordinatorErrc::join_closed:
      return "join_closed";
    case CoordinatorErrc::incomplete:
      return "incomplete";
    case CoordinatorErrc::join_timeout:
      return "join_timeout";
  }
  return "unknown";
}

}  // namespace actorpipe::internal
