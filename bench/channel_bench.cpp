// `actorpipe-bench channel`: two ranks of one job (their own ProcessGroup, the UCX worker the
// engine uses) time the UCX channel; ucx_perftest runs the same sizes on the same transports.
#include "bench/channel_bench.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "bench/machine.hpp"
#include "bench/rank_job.hpp"
#include "bench/step_timing.hpp"
#include "bench/subprocess.hpp"
#include "examples/launch/launcher.hpp"
#include "transport/ucx_channel.hpp"

namespace actorpipe::bench {

namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// Targets: at least 80% of ucx_perftest's bandwidth at 3 MiB and 64 MiB over shared memory; a
// waiting process takes less than 5% of a core.
constexpr double kBandwidthTarget = 0.80;
constexpr int64_t kTargetMinBytes = 3 << 20;
constexpr double kIdleTarget = 0.05;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string size_label(int64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= (1 << 10) && bytes % (1 << 10) == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

// ---- inside a rank -----------------------------------------------------------------------

/// The announcement of payload `sequence` on `ends`: what the control plane would carry.
/// Each side counts the sequence itself, so no control message is on the timed path.
Announcement announcement(const ChannelEnds& ends, uint64_t sequence, int64_t floats) {
  Announcement a;
  a.tag = ends.tag;
  a.sequence = sequence;
  a.microbatch = static_cast<int64_t>(sequence);
  a.dtype = DType::f32;
  a.ndim = 1;
  a.dims[0] = floats;
  return a;
}

/// The two channel ends a rank holds: rank 0 sends on the forward channel and receives on the
/// backward one, rank 1 the other way round.
struct RankChannels {
  std::unique_ptr<UcxChannel> out, in;
  uint64_t sent = 0, received = 0;

  Status send(const Tensor& t) {
    auto a = out->post(t, static_cast<int64_t>(sent), 0);
    if (!a) return a.error();
    ++sent;
    return {};
  }
  Status receive(int64_t floats) {
    auto t = in->receive(announcement(in->ends(), received, floats));
    if (!t) return t.error();
    ++received;
    return {};
  }
};

int run_rank(const ChannelBenchOptions& o) {
  auto joined = join_rank_job();
  if (!joined) {
    fmt::print(stderr, "actorpipe-bench channel: {}\n", joined.error().message);
    return 1;
  }
  ProcessGroup& g = **joined;
  const int rank = g.rank();
  const int peer = 1 - rank;
  const ChannelEnds forward = channel_ends(0, Direction::forward);
  const ChannelEnds backward = channel_ends(0, Direction::backward);
  UcxChannelOptions co;
  co.receive_timeout = std::chrono::milliseconds(120000);
  co.pool_capacity = 2;
  RankChannels ch;
  const UcxEndpoint ep = g.peers().at(peer);
  ch.out = UcxChannel::sender(g.ucx(), rank == 0 ? forward : backward, ep, co);
  ch.in = UcxChannel::receiver(g.ucx(), rank == 0 ? backward : forward, co);

  auto fail = [&](const Status& s, const std::string& what) {
    fmt::print(stderr, "actorpipe-bench channel: rank {}: {}: {}\n", rank, what, s.error().message);
    return 1;
  };
  Tensor ack = Tensor::zeros({2});
  for (int64_t bytes : o.sizes) {
    const int64_t floats = bytes / 4;
    Tensor payload = Tensor::zeros({floats});
    ch.in->reserve(DType::f32, {floats}, 1);
    const ChannelCounts n = channel_counts(bytes, o.scale);
    if (Status s = rank_barrier(g); !s) return fail(s, "barrier");

    // latency: ping-pong, the reply as large as the message; a tenth of the trips warm up
    const int warm = std::max(1, n.round_trips / 10);
    double lat_seconds = 0.0;
    for (int phase = 0; phase < 2; ++phase) {
      const int trips = phase == 0 ? warm : n.round_trips;
      const auto t0 = Clock::now();
      for (int i = 0; i < trips; ++i) {
        if (rank == 0) {
          if (Status s = ch.send(payload); !s) return fail(s, "latency send");
          if (Status s = ch.receive(floats); !s) return fail(s, "latency receive");
        } else {
          if (Status s = ch.receive(floats); !s) return fail(s, "latency receive");
          if (Status s = ch.send(payload); !s) return fail(s, "latency send");
        }
      }
      lat_seconds = seconds_since(t0);
    }
    if (rank == 0) {
      json j;
      j["name"] = "channel_latency";
      j["bytes"] = bytes;
      j["round_trips"] = n.round_trips;
      j["one_way_us"] = lat_seconds / n.round_trips / 2 * 1e6;
      fmt::print("{}\n", j.dump());
    }

    // bandwidth: `burst` back-to-back sends, then an 8-byte acknowledgement; one warm-up burst
    std::vector<double> rates;
    for (int rep = 0; rep <= o.reps; ++rep) {
      if (Status s = rank_barrier(g); !s) return fail(s, "barrier");
      const auto t0 = Clock::now();
      if (rank == 0) {
        for (int i = 0; i < n.burst; ++i)
          if (Status s = ch.send(payload); !s) return fail(s, "bandwidth send");
        if (Status s = ch.receive(2); !s) return fail(s, "acknowledgement");
      } else {
        for (int i = 0; i < n.burst; ++i)
          if (Status s = ch.receive(floats); !s) return fail(s, "bandwidth receive");
        if (Status s = ch.send(ack); !s) return fail(s, "acknowledgement");
      }
      const double t = seconds_since(t0);
      if (rep > 0) rates.push_back(static_cast<double>(bytes) * n.burst / t);
    }
    if (Status s = ch.out->wait_sent(std::chrono::milliseconds(60000)); !s) return fail(s, "flush");
    if (rank == 0) {
      json j;
      j["name"] = "channel_bandwidth";
      j["bytes"] = bytes;
      j["burst"] = n.burst;
      j["bytes_per_s"] = median(rates);
      j["bytes_per_s_reps"] = rates;
      fmt::print("{}\n", j.dump());
    }
  }

  // a waiting process: rank 1 waits in receive() while rank 0 sleeps, then gets 8 bytes; each
  // measures its own process's CPU time (every thread: CAF, the middleman, UCX's progress)
  if (Status s = rank_barrier(g); !s) return fail(s, "barrier");
  const double cpu0 = process_cpu_seconds();
  const auto t0 = Clock::now();
  if (rank == 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(o.idle_seconds));
    if (Status s = ch.send(ack); !s) return fail(s, "idle send");
  } else {
    if (Status s = ch.receive(2); !s) return fail(s, "idle receive");
  }
  const double wall = seconds_since(t0);
  const double cpu = process_cpu_seconds() - cpu0;
  json j;
  j["name"] = "channel_idle";
  j["rank"] = rank;
  j["waiting"] = rank == 0 ? "sleeping, UCX and CAF threads alive" : "in UcxChannel::receive";
  j["wall_s"] = wall;
  j["cpu_s"] = cpu;
  j["cores"] = wall > 0 ? cpu / wall : 0.0;
  fmt::print("{}\n", j.dump());
  std::fflush(stdout);
  if (Status s = ch.out->wait_sent(std::chrono::milliseconds(60000)); !s) return fail(s, "flush");
  if (Status s = g.leave(); !s) return fail(s, "leave");
  return 0;
}

// ---- the parent --------------------------------------------------------------------------

struct PeerFigures {
  bool ran = false;
  std::string error;
  double latency_us = 0.0;
  double bytes_per_s = 0.0;
};

/// ucx_perftest tag_lat and tag_bw for `bytes` over UCX_TLS=`tls`, as many messages as ours.
PeerFigures run_perftest(const ChannelBenchOptions& o, const std::string& tls, int64_t bytes) {
  PeerFigures p;
  const ChannelCounts n = channel_counts(bytes, o.scale);
  const std::string script = peer_script_path(o.peer_script, "ucx_perftest_pair.sh");
  for (const bool lat : {true, false}) {
    auto port = pick_free_port("127.0.0.1");
    if (!port) {
      p.error = port.error().message;
      return p;
    }
    const int iters = lat ? n.round_trips : n.burst * std::max(o.reps, 1);
    const int warmup = lat ? std::max(1, n.round_trips / 10) : n.burst;
    auto proc = run_process(
        {"/bin/sh", script, std::to_string(*port), "-t", lat ? "tag_lat" : "tag_bw", "-s",
         std::to_string(bytes), "-n", std::to_string(iters), "-w", std::to_string(warmup)},
        {{"UCX_TLS", tls}});
    if (!proc) {
      p.error = proc.error().message;
      return p;
    }
    if (proc->exit_code != 0) {
      p.error = fmt::format("ucx_perftest pair exited with status {}", proc->exit_code);
      return p;
    }
    auto f = parse_perftest_final(proc->out, bytes);
    if (!f) {
      p.error = f.error().message;
      return p;
    }
    (lat ? p.latency_us : p.bytes_per_s) = lat ? f->latency_us : f->bytes_per_s;
  }
  p.ran = true;
  return p;
}

}  // namespace

std::string channel_usage() {
  return R"(usage: actorpipe-bench channel [options]

The UCX tensor channel between two processes (two ranks of one job, each with the ProcessGroup
and UCX worker the engine uses): one-way latency (ping-pong, half the round trip) and bandwidth
(back-to-back sends until an 8-byte acknowledgement) per payload size, side by side with
ucx_perftest (tag_lat, tag_bw; package ucx-utils) on the same transport in the same run, in
alternating rounds (this machine's memory bandwidth drifts by 2x between minutes); and the CPU a
waiting process takes (one rank waits in a receive while the other sleeps).
Targets: >= 80% of ucx_perftest's bandwidth at 3 MiB and 64 MiB over shared memory (sm);
a waiting process < 5% of a core.

  --sizes a,b,...      payload bytes, multiples of 4 (default: 8,65536,3145728,67108864)
  --transports a,b     UCX_TLS of each job: sm, tcp, posix, ... (default: sm,tcp)
  --reps N             bandwidth bursts per size and round, median taken (default: 3)
  --repeats N          rounds: a fresh two-rank job, then ucx_perftest (default: 5)
  --idle-seconds S     how long the waiting process waits, 0.1 to 60 (default: 2)
  --scale F            message counts times F, 0.001 to 100 (default: 1)
  --no-peer            do not run ucx_perftest
  --json               one JSON object per line instead of tables
  --peer-script PATH   the ucx_perftest pair (default: bench/peers/ucx_perftest_pair.sh)
)";
}

Expected<ChannelBenchOptions> parse_channel_options(std::span<const std::string> args) {
  ChannelBenchOptions o;
  auto parse_double = [&](size_t& i, double lo, double hi, double& out) -> Status {
    auto v = option_value(args, i);
    if (!v) return v.error();
    char* end = nullptr;
    const double d = std::strtod(v->c_str(), &end);
    if (v->empty() || end != v->c_str() + v->size() || !std::isfinite(d) || d < lo || d > hi)
      return make_error("{}: '{}' is not allowed: expected a number from {} to {}", args[i - 1], *v,
                        lo, hi);
    out = d;
    return {};
  };
  const Status parsed = parse_options(args, o, [&](size_t& i) -> Status {
    const std::string& a = args[i];
    if (a == "--sizes") {
      auto v = int_list_option(args, i, 4, 1 << 30);
      if (!v) return v.error();
      o.sizes.clear();
      for (int s : *v) {
        if (s % 4 != 0)
          return make_error("--sizes: {} is not a multiple of 4 (the payloads are f32 tensors)", s);
        o.sizes.push_back(s);
      }
    } else if (a == "--transports") {
      auto v = option_value(args, i);
      if (!v) return v.error();
      o.transports = split_commas(*v);
      for (const std::string& t : o.transports)
        if (t.empty() || t.find_first_of(" \t;") != std::string::npos)
          return make_error("--transports: '{}' is not a UCX_TLS value", t);
    } else if (a == "--reps" || a == "--repeats") {
      auto n = int_option(args, i, 1, 1000);
      if (!n) return n.error();
      (a == "--reps" ? o.reps : o.repeats) = *n;
    } else if (a == "--idle-seconds") {
      return parse_double(i, 0.1, 60.0, o.idle_seconds);
    } else if (a == "--scale") {
      return parse_double(i, 0.001, 100.0, o.scale);
    } else if (a == "--rank-child") {
      auto v = option_value(args, i);
      if (!v) return v.error();
      o.rank_child = *v;
    } else {
      return make_error("unknown option '{}' (see actorpipe-bench channel --help)", a);
    }
    return {};
  });
  if (!parsed) return parsed.error();
  return o;
}

ChannelCounts channel_counts(int64_t bytes, double scale) {
  ChannelCounts c;
  if (bytes <= 4096) {
    c = {5000, 20000};
  } else if (bytes <= (1 << 20)) {
    c = {2000, 4000};
  } else if (bytes <= (16 << 20)) {
    c = {100, 200};
  } else {
    c = {10, 10};
  }
  c.round_trips = std::max(1, static_cast<int>(std::lround(c.round_trips * scale)));
  c.burst = std::max(1, static_cast<int>(std::lround(c.burst * scale)));
  return c;
}

Expected<PerftestFinal> parse_perftest_final(const std::string& output, int64_t bytes) {
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find("Final:");
    if (at == std::string::npos) continue;
    std::istringstream fields(line.substr(at + 6));
    std::vector<double> v;
    double x = 0.0;
    while (fields >> x) v.push_back(x);
    if (v.size() < 8)
      return make_error("ucx_perftest: a 'Final:' line with {} numbers, expected 8: '{}'", v.size(),
                        line);
    // iterations, overhead 50%ile / average / overall (µs), bandwidth average / overall
    // (MB/s, 2^20 B), message rate average / overall (msg/s)
    PerftestFinal f;
    f.latency_us = v[3];
    f.bytes_per_s = v[7] * static_cast<double>(bytes);
    return f;
  }
  return make_error("ucx_perftest printed no 'Final:' line: '{}'", output.substr(0, 300));
}

int run_channel_bench(std::span<const std::string> args) {
  auto parsed = parse_channel_options(args);
  if (!parsed) {
    fmt::print(stderr, "actorpipe-bench channel: {}\n", parsed.error().message);
    return 2;
  }
  const ChannelBenchOptions& o = *parsed;
  if (o.help) {
    fmt::print("{}", channel_usage());
    return 0;
  }
  if (!o.rank_child.empty()) return run_rank(o);

  const Interference start = sample_interference(std::chrono::milliseconds(500));
  const std::string machine = describe_machine();
  warn_if_busy("actorpipe-bench", start);
  const bool peer = o.peer && have_ucx_perftest();
  if (!o.json) {
    fmt::print(
        "actorpipe-bench channel: the UCX tensor channel between two processes on 127.0.0.1\n"
        "machine: {}; other processes at the start: {} cores\n"
        "latency: one way (half a ping-pong round trip); bandwidth: back-to-back sends of one "
        "size until an acknowledgement, median of {} bursts (GB/s = 1e9 B/s)\n"
        "peer: ucx_perftest -t tag_lat / tag_bw, the same sizes and message counts, the same "
        "UCX_TLS{}\n"
        "{} rounds, each a fresh two-rank job then ucx_perftest; medians over the rounds; ratio: "
        "median of each round's channel / perftest bandwidth\n",
        machine, interference_cell(start), o.reps,
        o.peer ? (peer ? "" : " (missing: ucx_perftest not on PATH, package ucx-utils)")
               : " (skipped: --no-peer)",
        o.repeats);
    fmt::print("\n{:<10} {:>8} {:>12} {:>12} {:>10} {:>10} {:>7}  {:<16} {:<22} {}\n", "UCX_TLS",
               "size", "channel us", "perftest us", "channel", "perftest", "ratio",
               "target (>= 80%)", "ratio per round", "other");
  }
  std::string sizes;
  for (int64_t s : o.sizes) {
    if (!sizes.empty()) sizes += ',';
    sizes += std::to_string(s);
  }
  int failures = 0;
  int disturbed = 0;
  std::vector<json> idle_rows;
  for (const std::string& tls : o.transports) {
    const size_t n = o.sizes.size();
    // per size, one entry per round
    std::vector<std::vector<double>> lat(n), bw(n), peer_lat(n), peer_bw(n), ratios(n);
    std::vector<std::string> peer_error(n);
    std::vector<double> idle_cores(2, 0.0);
    std::vector<json> idle_worst(2);
    Interference worst;
    bool failed = false;
    for (int round = 0; round < o.repeats && !failed; ++round) {
      const CpuSnapshot before = cpu_snapshot();
      auto job = run_rank_job({"channel", "--rank-child", tls, "--reps", std::to_string(o.reps),
                               "--idle-seconds", fmt::format("{}", o.idle_seconds), "--scale",
                               fmt::format("{}", o.scale), "--sizes", sizes},
                              2, {{"UCX_TLS", tls}});
      if (!job || !job->failure.empty()) {
        fmt::print(stderr, "actorpipe-bench channel: UCX_TLS={}: {}\n", tls,
                   job ? job->failure : job.error().message);
        failed = true;
        break;
      }
      auto lines_named = [&](int rank, const std::string& name) {
        std::vector<json> out;
        for (const std::string& l : job->out[static_cast<size_t>(rank)]) {
          auto j = json::parse(l, nullptr, false);
          if (!j.is_discarded() && j.is_object() && j.value("name", "") == name)
            out.push_back(std::move(j));
        }
        return out;
      };
      const auto l = lines_named(0, "channel_latency");
      const auto b = lines_named(0, "channel_bandwidth");
      if (l.size() != n || b.size() != n) {
        fmt::print(stderr, "actorpipe-bench channel: UCX_TLS={}: rank 0 reported {} of {} sizes\n",
                   tls, std::min(l.size(), b.size()), n);
        failed = true;
        break;
      }
      for (int rank = 0; rank < 2; ++rank)
        for (json& j : lines_named(rank, "channel_idle"))
          if (j["cores"].get<double>() >= idle_cores[static_cast<size_t>(rank)]) {
            idle_cores[static_cast<size_t>(rank)] = j["cores"].get<double>();
            idle_worst[static_cast<size_t>(rank)] = std::move(j);
          }
      for (size_t k = 0; k < n; ++k) {
        lat[k].push_back(l[k]["one_way_us"].get<double>());
        bw[k].push_back(b[k]["bytes_per_s"].get<double>());
        if (!peer) continue;
        const PeerFigures pf = run_perftest(o, tls, o.sizes[k]);
        if (!pf.ran) {
          peer_error[k] = pf.error;
          continue;
        }
        peer_lat[k].push_back(pf.latency_us);
        peer_bw[k].push_back(pf.bytes_per_s);
        ratios[k].push_back(bw[k].back() / pf.bytes_per_s);
      }
      const Interference other = interference(before, cpu_snapshot());
      disturbed += distorted(other) ? 1 : 0;
      if (!worst.known || other.other + other.steal > worst.other + worst.steal) worst = other;
    }
    if (failed) {
      ++failures;
      continue;
    }
    for (size_t k = 0; k < n; ++k) {
      const int64_t bytes = o.sizes[k];
      const bool ran = !ratios[k].empty();
      if (peer && !ran)
        fmt::print(stderr, "actorpipe-bench channel: ucx_perftest: {}\n", peer_error[k]);
      const double ratio = ran ? median(ratios[k]) : 0.0;
      const bool targeted = tls == "sm" && bytes >= kTargetMinBytes;
      json j;
      j["name"] = "channel";
      j["machine"] = machine;
      j["ucx_tls"] = tls;
      j["bytes"] = bytes;
      j["one_way_us"] = median(lat[k]);
      j["bytes_per_s"] = median(bw[k]);
      j["bytes_per_s_rounds"] = bw[k];
      j["round_trips"] = channel_counts(bytes, o.scale).round_trips;
      j["burst"] = channel_counts(bytes, o.scale).burst;
      j["peer_ran"] = ran;
      if (ran) {
        j["peer_one_way_us"] = median(peer_lat[k]);
        j["peer_bytes_per_s"] = median(peer_bw[k]);
        j["peer_bytes_per_s_rounds"] = peer_bw[k];
        j["ratio"] = ratio;
        j["ratio_rounds"] = ratios[k];
      } else if (!peer_error[k].empty()) {
        j["peer_error"] = peer_error[k];
      }
      if (targeted) j["meets_target"] = ran ? json(ratio >= kBandwidthTarget) : json(nullptr);
      add_interference(j, worst);
      if (o.json) {
        fmt::print("{}\n", j.dump());
      } else {
        const std::string target =
            !targeted ? "" : (!ran ? "no peer" : (ratio >= kBandwidthTarget ? "ok" : "MISSED"));
        std::string per_round;
        for (double r : ratios[k]) {
          if (!per_round.empty()) per_round += ' ';
          per_round += fmt::format("{:.0f}", r * 100);
        }
        fmt::print("{:<10} {:>8} {:>12.2f} {:>12} {:>10} {:>10} {:>7}  {:<16} {:<22} {}\n", tls,
                   size_label(bytes), median(lat[k]),
                   ran ? fmt::format("{:.2f}", median(peer_lat[k])) : "-",
                   fmt::format("{:.2f} GB/s", median(bw[k]) / 1e9),
                   ran ? fmt::format("{:.2f} GB/s", median(peer_bw[k]) / 1e9) : "-",
                   ran ? fmt::format("{:.0f}%", ratio * 100) : "-", target, per_round,
                   interference_cell(worst));
      }
      std::fflush(stdout);
    }
    for (json& j : idle_worst) {
      if (j.is_null()) continue;
      j["ucx_tls"] = tls;
      j["meets_target"] = j["cores"].get<double>() < kIdleTarget;
      idle_rows.push_back(std::move(j));
    }
  }
  if (!o.json && !idle_rows.empty())
    fmt::print(
        "\nwaiting process: CPU time of the whole process (CAF, middleman, UCX progress thread) "
        "over the wait, the most of any round\n{:<10} {:>5} {:>8} {:>10} {:>8}  {:<16} {}\n",
        "UCX_TLS", "rank", "wait s", "cpu ms", "cores", "target (< 5%)", "waiting");
  for (const json& j : idle_rows) {
    if (o.json) {
      fmt::print("{}\n", j.dump());
      continue;
    }
    fmt::print("{:<10} {:>5} {:>8.2f} {:>10.2f} {:>7.2f}%  {:<16} {}\n",
               j["ucx_tls"].get<std::string>(), j["rank"].get<int>(), j["wall_s"].get<double>(),
               j["cpu_s"].get<double>() * 1e3, j["cores"].get<double>() * 100,
               j["meets_target"].get<bool>() ? "ok" : "MISSED", j["waiting"].get<std::string>());
  }
  if (!o.json) fmt::print("\n{}\n", interference_summary(disturbed));
  return failures == 0 ? 0 : 1;
}

}  // namespace actorpipe::bench
