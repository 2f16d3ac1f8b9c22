// `actorpipe-bench channel`: latency and bandwidth of the UCX tensor channel between two
// processes, side by side with ucx_perftest on the same transports, and a waiting process's CPU.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "bench/cli_args.hpp"
#include "engine/expected.hpp"

namespace actorpipe::bench {

/// With CommonOptions: the peer is ucx_perftest (package ucx-utils).
struct ChannelBenchOptions : CommonOptions {
  /// --sizes: payload bytes, each a multiple of 4 (f32 tensors); default 8 B, 64 KiB, one GPT-small
  /// activation (8x256x384 floats, 3 MiB) and 64 MiB.
  std::vector<int64_t> sizes = {8, 64 << 10, 8 * 256 * 384 * 4, int64_t{64} << 20};
  /// --transports: UCX_TLS values, one job each (sm: shared memory, tcp).
  std::vector<std::string> transports = {"sm", "tcp"};
  int reps = 3;             ///< --reps N: bandwidth bursts per size and round (median taken)
  int repeats = 5;          ///< --repeats N: rounds (a fresh job, then ucx_perftest)
  double idle_seconds = 2;  ///< --idle-seconds S: how long the waiting-CPU measurement waits
  double scale = 1.0;       ///< --scale F: message counts times F (smoke tests use less)
  std::string rank_child;   ///< --rank-child TLS (internal): run as a rank of the job
};

/// Parses the arguments after `channel`; errors name the option, the value and what is allowed.
Expected<ChannelBenchOptions> parse_channel_options(std::span<const std::string> args);

/// The `actorpipe-bench channel --help` text.
std::string channel_usage();

/// The messages each measurement sends for a payload of `bytes`: ping-pong round trips of the
/// latency run and back-to-back sends of one bandwidth repetition, at least 1 each, about 0.1 to
/// 1 s of traffic over shared memory; times `scale`.
struct ChannelCounts {
  int round_trips = 1;
  int burst = 1;
};
ChannelCounts channel_counts(int64_t bytes, double scale);

/// What ucx_perftest printed on its "Final:" line: one-way latency (tag_lat: half the round
/// trip) in µs, and bytes per second (tag_bw: overall messages per second times the size).
struct PerftestFinal {
  double latency_us = 0.0;
  double bytes_per_s = 0.0;
};
/// Reads the "Final:" line of ucx_perftest's output for messages of `bytes`. Errors: no such
/// line, or one with fewer than 8 numbers.
Expected<PerftestFinal> parse_perftest_final(const std::string& output, int64_t bytes);

/// Runs `actorpipe-bench channel` with `args` (the arguments after `channel`); returns the exit
/// code.
int run_channel_bench(std::span<const std::string> args);

}  // namespace actorpipe::bench
