// Gloo bandwidth: how long GlooGroup::all_reduce_sum takes on this host, measured with the
// members as threads of one process over loopback TCP (the planner's all-reduce cost).
#pragma once

#include <cstdint>

#include "engine/expected.hpp"

namespace actorpipe {

/// One measurement of the all-reduce.
struct AllReduceTiming {
  int members = 2;
  int64_t floats = 0;
  double seconds = 0.0;  ///< median of the timed calls (of member 0)
  /// Bytes a member sends per call (2·(members−1)/members of the buffer, GlooGroup::bytes_sent)
  /// per second: the figure PlannerOptions::allreduce_bandwidth takes.
  double bytes_per_second = 0.0;
};

/// Times GlooGroup::all_reduce_sum of `floats` floats among `members` members, each a thread of
/// this process with its own group over 127.0.0.1: one untimed call, then `reps` timed ones;
/// the median of member 0's. On one host that is what the processes of a job get (they share
/// its cores); between hosts the network decides. Errors: members < 2, floats < 1, reps < 1, and
/// Gloo's (naming the member).
Expected<AllReduceTiming> time_local_all_reduce(int members, int64_t floats, int reps);

}  // namespace actorpipe
