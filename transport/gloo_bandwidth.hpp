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

/// The all-reduce's cost model on this host (PlannerOptions::allreduce_latency and
/// allreduce_bandwidth): two members time a one-float call (the latency) and a call of `floats`
/// floats; the bandwidth is what the larger call's bytes added over the small one's per second
/// of the time it added (the larger call's own bytes per second when it was not slower).
struct AllReduceCost {
  double latency = 0.0;    ///< seconds
  double bandwidth = 0.0;  ///< bytes a member sends per second
  AllReduceTiming tiny, large;
};
Expected<AllReduceCost> measure_all_reduce_cost(int64_t floats, int reps);

}  // namespace actorpipe
