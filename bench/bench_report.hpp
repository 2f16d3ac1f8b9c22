// Benchmark report: one measurement (actorpipe's step, its GEMM floor and the PyTorch peer
// for one shape and thread count) as a table row, a JSON line and a profile table.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_shapes.hpp"
#include "bench/machine.hpp"
#include "bench/step_timing.hpp"
#include "bench/torch_peer.hpp"

namespace actorpipe::bench {

struct Measurement {
  BenchShape shape;
  StepResult ours;
  PeerResult peer;     // peer.ran is false when the peer was skipped or missing
  Interference other;  // what ran besides the benchmark during both measurements
};

/// ours / peer tokens per second (0 without a peer measurement).
double peer_ratio(const Measurement& m);

/// One JSON object: name, shape, threads, tokens_per_s, gflops, peak_rss_mb,
/// peer_tokens_per_s, ratio (ours/peer), floor_ratio (step/floor), and the details behind
/// them. Missing values are null.
nlohmann::ordered_json measurement_json(const Measurement& m);

/// The table's column titles and one row per measurement.
std::string table_header();
std::string table_row(const Measurement& m);

/// The per-category breakdown of m.ours.profile (empty when there is none).
std::string profile_table(const Measurement& m);

/// The figures of several runs in one table cell, each with `format`: "1562 1361".
std::string cells(const std::vector<double>& v, const char* format);

/// A child process's standard output as lines (without their '\n').
std::vector<std::string> split_lines(const std::string& out);

}  // namespace actorpipe::bench
