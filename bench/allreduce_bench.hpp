// `actorpipe-bench allreduce`: the replicas' gradient all-reduce (GlooGroup::all_reduce_sum over
// Gloo's TCP transport) between two processes, side by side with ucx_perftest's TCP bandwidth.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "bench/cli_args.hpp"
#include "engine/expected.hpp"
#include "engine/options.hpp"

namespace actorpipe::bench {

/// One buffer size the command measures: bytes (a multiple of 4: f32) and what it is, e.g.
/// "small stage 0 of 2" for the gradient buffer of a pipeline stage; empty for a fixed size.
struct AllreduceSize {
  int64_t bytes = 0;
  std::string label;
  friend bool operator==(const AllreduceSize&, const AllreduceSize&) = default;
};

/// The floats of each stage's gradient buffer (every layer of the stage, tied copies included:
/// what UpdateJob::gradients() hands the replicas' all-reduce) for `model` cut into `stages`
/// stages by the even partition. Errors: the model does not build, or the partition is invalid.
Expected<std::vector<int64_t>> stage_gradient_floats(const ModelOptions& model, int stages);

/// The default sizes: 64 KiB, 4 MiB, GPT small's stage 0 and stage 1 gradient buffers of the
/// default 2-stage even partition, 64 MiB.
std::vector<AllreduceSize> default_allreduce_sizes();

/// With CommonOptions: the peer is ucx_perftest (package ucx-utils).
struct AllreduceBenchOptions : CommonOptions {
  std::vector<AllreduceSize> sizes = default_allreduce_sizes();  ///< --sizes a,b (bytes)
  int rounds = 3;  ///< --rounds N: a fresh two-rank job, then ucx_perftest, N times
  int calls = 0;   ///< --calls N: timed all-reduces per size and round; 0 = by size
  /// ucx_perftest's messages are channel_counts(bytes, scale).burst x 3 (as `channel`).
  double scale = 1.0;
  bool quick = false;       ///< --quick: 64 KiB and 1 MiB, 1 round, 5 calls (the smoke test)
  bool rank_child = false;  ///< --rank-child (internal): run as a rank of the job
};

/// Parses the arguments after `allreduce`; errors name the option, the value and what is
/// allowed. --quick sets the sizes, rounds and calls that are not given explicitly.
Expected<AllreduceBenchOptions> parse_allreduce_options(std::span<const std::string> args);

/// The `actorpipe-bench allreduce --help` text.
std::string allreduce_usage();

/// Timed all-reduce calls for a buffer of `bytes`: `calls` when positive, else 200 up to
/// 256 KiB, 50 up to 4 MiB, 20 up to 16 MiB, 10 above.
int allreduce_calls(int64_t bytes, int calls);
/// Untimed calls before them: a tenth, at least 1.
int allreduce_warmup(int calls);

/// Payload bytes one member of a group of `world` sends in one all_reduce_sum of `floats`
/// floats (GlooGroup::bytes_sent): 2 (world-1) ceil(floats/world) x 4; 0 for one member or
/// no floats.
int64_t allreduce_bytes_sent(int64_t floats, int world);

/// One measurement's figures: the median time of a call, the buffer's bytes over it
/// (algorithm bandwidth) and the bytes a member sent over it (bus bandwidth), in B/s.
struct AllreduceFigures {
  double seconds = 0.0;
  double alg_bytes_per_s = 0.0;
  double bus_bytes_per_s = 0.0;
};
AllreduceFigures allreduce_figures(int64_t bytes, int64_t bytes_sent_per_call, double seconds);

/// One size over every round: ours (the slower rank's median call, per round) and
/// ucx_perftest's tag_bw bandwidth (per round; empty when it did not run).
struct AllreduceRow {
  AllreduceSize size;
  int calls = 0;
  int64_t bytes_sent_per_call = 0;       ///< measured: GlooGroup::bytes_sent over the timed calls
  std::vector<double> seconds;           ///< per round
  std::vector<double> peer_bytes_per_s;  ///< per round
  std::string peer_note;                 ///< why ucx_perftest has no figure, when it has none
  std::string other;                     ///< the interference cell (machine.hpp)

  AllreduceFigures figures() const;  ///< from the median of `seconds`
  AllreduceFigures round(size_t k) const;
  bool peer_ran() const { return !peer_bytes_per_s.empty(); }
  double peer_median() const;
  /// Per round: ours bus bandwidth / ucx_perftest's (rounds both have).
  std::vector<double> ratios() const;
};

/// "64 KiB", "4 MiB", "32.6 MiB" (one decimal when not whole), "12 B".
std::string allreduce_size_label(int64_t bytes);

/// The table of medians: one line per row, with the header; GB/s = 1e9 B/s.
std::string allreduce_table(const std::vector<AllreduceRow>& rows);
/// Each round's figures: one line per row and round, with the header.
std::string allreduce_rounds_table(const std::vector<AllreduceRow>& rows);

/// Runs `actorpipe-bench allreduce` with `args` (the arguments after `allreduce`); returns the
/// exit code.
int run_allreduce_bench(std::span<const std::string> args);

}  // namespace actorpipe::bench
