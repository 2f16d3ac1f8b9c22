// `actorpipe-bench allreduce`: two ranks of one job connect a two-member GlooGroup through their
// ProcessGroup (as ReplicaReducer does) and time all_reduce_sum per buffer size; ucx_perftest
// tag_bw over UCX_TLS=tcp runs the same sizes after each job, in alternating rounds.
#include "bench/allreduce_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "actors/process_group.hpp"
#include "actors/replica_reducer.hpp"
#include "bench/bench_shapes.hpp"
#include "bench/channel_bench.hpp"
#include "bench/machine.hpp"
#include "bench/rank_job.hpp"
#include "bench/step_timing.hpp"
#include "bench/subprocess.hpp"
#include "engine/model/model.hpp"
#include "engine/model/partition.hpp"
#include "examples/launch/launcher.hpp"
#include "kernels/tensor.hpp"
#include "transport/gloo_group.hpp"

namespace actorpipe::bench {

namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr int kWorld = 2;
constexpr int kStages = 2;
constexpr const char* kShape = "small";
constexpr int64_t kMaxBytes = int64_t{1} << 30;
// The verification pattern: member r's element i is (r + 1) + (i mod 2^20): every sum of a few
// members is an exact float, and a chunk in the wrong place shows.
constexpr int64_t kPatternPeriod = int64_t{1} << 20;

float pattern(int rank, int64_t i) {
  return static_cast<float>(rank + 1) + static_cast<float>(i % kPatternPeriod);
}

std::vector<AllreduceSize> labelled(const std::vector<int64_t>& bytes) {
  const std::vector<AllreduceSize> defaults = default_allreduce_sizes();
  std::vector<AllreduceSize> out;
  for (int64_t b : bytes) {
    AllreduceSize s{b, ""};
    for (const AllreduceSize& d : defaults)
      if (d.bytes == b) s.label = d.label;
    out.push_back(s);
  }
  return out;
}

std::string sizes_argument(const std::vector<AllreduceSize>& sizes) {
  std::string s;
  for (const AllreduceSize& z : sizes) {
    if (!s.empty()) s += ',';
    s += std::to_string(z.bytes);
  }
  return s;
}

std::string cells(const std::vector<double>& v, double unit, const char* format) {
  std::string s;
  for (double x : v) {
    if (!s.empty()) s += ' ';
    s += fmt::format(fmt::runtime(format), x / unit);
  }
  return s;
}

std::string size_cell(const AllreduceSize& s) {
  return s.label.empty() ? allreduce_size_label(s.bytes)
                         : fmt::format("{} ({})", allreduce_size_label(s.bytes), s.label);
}

// ---- inside a rank -----------------------------------------------------------------------

int run_rank(const AllreduceBenchOptions& o) {
  auto joined = join_rank_job();
  if (!joined) {
    fmt::print(stderr, "actorpipe-bench allreduce: {}\n", joined.error().message);
    return 1;
  }
  ProcessGroup& g = **joined;
  const int rank = g.rank();
  auto fail = [&](const std::string& what, const std::string& why) {
    fmt::print(stderr, "actorpipe-bench allreduce: rank {}: {}: {}\n", rank, what, why);
    return 1;
  };
  // as ReplicaReducer::connect: the TCP device binds the address this process reaches the
  // coordinator from, and the members' texts cross in one all-gather of the job
  const ProcessGroupOptions& po = g.options();
  auto host = local_address_towards(po.coordinator_host, po.coordinator_port);
  if (!host) return fail("address", host.error().message);
  GlooGroupOptions go;
  go.rank = rank;
  go.size = g.world();
  go.host = *host;
  go.timeout = std::chrono::milliseconds(120000);
  go.name = "the bench's replicas";
  auto exchange = [&](std::string text) -> Expected<std::vector<std::string>> {
    RankPart part;
    part.text = std::move(text);
    auto parts = g.all_gather(std::move(part));
    if (!parts) return parts.error();
    std::vector<std::string> texts;
    for (const RankPart& p : *parts) texts.push_back(p.text);
    return texts;
  };
  auto connected = GlooGroup::connect(go, exchange);
  if (!connected) return fail("connect", connected.error().message);
  GlooGroup& group = **connected;

  for (const AllreduceSize& size : o.sizes) {
    const int64_t floats = size.bytes / 4;
    // the engine's gradient buffers are tensors (whole huge pages from 2 MiB on)
    Tensor buffer = Tensor::zeros({floats});
    std::span<float> data = buffer.span_f32();
    const int calls = allreduce_calls(size.bytes, o.calls);
    if (Status s = rank_barrier(g); !s) return fail("barrier", s.error().message);
    for (int i = 0; i < allreduce_warmup(calls); ++i)
      if (Status s = group.all_reduce_sum(data); !s) return fail("warm-up", s.error().message);
    const int64_t sent0 = group.bytes_sent();
    std::vector<double> seconds;
    for (int i = 0; i < calls; ++i) {
      const auto t0 = Clock::now();
      if (Status s = group.all_reduce_sum(data); !s) return fail("all-reduce", s.error().message);
      seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    const int64_t sent = group.bytes_sent() - sent0;

    // correctness: one more call on the pattern, every element against the serial sum
    for (int64_t i = 0; i < floats; ++i) data[static_cast<size_t>(i)] = pattern(rank, i);
    if (Status s = group.all_reduce_sum(data); !s) return fail("verify", s.error().message);
    int64_t wrong = 0, first_wrong = -1;
    for (int64_t i = 0; i < floats; ++i) {
      float expect = pattern(0, i);
      for (int r = 1; r < go.size; ++r) expect += pattern(r, i);
      if (data[static_cast<size_t>(i)] != expect) {
        if (first_wrong < 0) first_wrong = i;
        ++wrong;
      }
    }
    if (wrong > 0) {
      float expect = pattern(0, first_wrong);
      for (int r = 1; r < go.size; ++r) expect += pattern(r, first_wrong);
      return fail(
          fmt::format("all_reduce_sum of {} floats", floats),
          fmt::format("WRONG RESULT: {} of {} elements differ from the serial sum; the "
                      "first, element {}, is {} instead of {}",
                      wrong, floats, first_wrong, data[static_cast<size_t>(first_wrong)], expect));
    }
    json j;
    j["name"] = "allreduce_rank";
    j["rank"] = rank;
    j["bytes"] = size.bytes;
    j["calls"] = calls;
    j["warmup"] = allreduce_warmup(calls);
    j["median_s"] = median(seconds);
    j["seconds"] = seconds;
    j["bytes_sent_per_call"] = calls > 0 ? sent / calls : 0;
    j["verified"] = true;
    fmt::print("{}\n", j.dump());
    std::fflush(stdout);
  }
  // every member is done with its last call before any closes its connections
  if (Status s = rank_barrier(g); !s) return fail("barrier", s.error().message);
  connected->reset();
  if (Status s = g.leave(); !s) return fail("leave", s.error().message);
  return 0;
}

// ---- the parent --------------------------------------------------------------------------

struct PerftestResult {
  bool ran = false;
  std::string error;
  double bytes_per_s = 0.0;
};

/// ucx_perftest tag_bw for `bytes` over UCX_TLS=tcp: as `channel` runs it (the same pair script,
/// message count and warm-up).
PerftestResult run_perftest_bw(const AllreduceBenchOptions& o, int64_t bytes) {
  PerftestResult p;
  const ChannelCounts n = channel_counts(bytes, o.scale);
  auto port = pick_free_port("127.0.0.1");
  if (!port) {
    p.error = port.error().message;
    return p;
  }
  auto proc = run_process({"/bin/sh", peer_script_path(o.peer_script, "ucx_perftest_pair.sh"),
                           std::to_string(*port), "-t", "tag_bw", "-s", std::to_string(bytes), "-n",
                           std::to_string(n.burst * 3), "-w", std::to_string(n.burst)},
                          {{"UCX_TLS", "tcp"}});
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
  p.bytes_per_s = f->bytes_per_s;
  p.ran = true;
  return p;
}

}  // namespace

Expected<std::vector<int64_t>> stage_gradient_floats(const ModelOptions& model, int stages) {
  auto m = Model::build(model);
  if (!m) return m.error();
  auto p = Partition::even(m->num_layers(), stages);
  if (!p) return p.error();
  std::vector<int64_t> out;
  for (int s = 0; s < stages; ++s) {
    int64_t floats = 0;
    for (int l = p->begin(s); l < p->end(s); ++l)
      floats += static_cast<int64_t>(m->layer(l).param_floats());
    out.push_back(floats);
  }
  return out;
}

std::vector<AllreduceSize> default_allreduce_sizes() {
  std::vector<AllreduceSize> out = {{int64_t{64} << 10, ""}, {int64_t{4} << 20, ""}};
  const BenchShape shape = find_bench_shape(kShape).value();
  const std::vector<int64_t> stages = stage_gradient_floats(shape.model, kStages).value();
  for (size_t s = 0; s < stages.size(); ++s)
    out.push_back({stages[s] * 4, fmt::format("{} stage {} of {}", kShape, s, kStages)});
  out.push_back({int64_t{64} << 20, ""});
  return out;
}

std::string allreduce_usage() {
  return R"(usage: actorpipe-bench allreduce [options]

The replicas' gradient all-reduce between two processes (two ranks of one job on 127.0.0.1, each
a member of one GlooGroup connected through the job's process group as ReplicaReducer does):
GlooGroup::all_reduce_sum (gloo::alltoall, a sum in member order, gloo::allgather over Gloo's
TCP transport) of f32 buffers of GPT small's per-stage gradient sizes (the default 2-stage even
partition) and fixed sizes; per size: warm-up calls, then timed calls, the median call of the
slower rank; algorithm bandwidth = buffer bytes / time, bus bandwidth = bytes each member sent
(GlooGroup::bytes_sent per call: 2 (w-1)/w of the buffer) / time. Each size's result is checked
against the serial sum after the timed calls. Beside it: ucx_perftest -t tag_bw (package
ucx-utils) between a server and a client on 127.0.0.1 with UCX_TLS=tcp, the same sizes, after
each job; rounds alternate, medians and each round's figures are printed.

  --sizes a,b,...      buffer bytes, multiples of 4, at most 1 GiB (default: 65536, 4194304,
                       GPT small's stage 0 and stage 1 gradient bytes, 67108864)
  --rounds N           rounds: a fresh two-rank job, then ucx_perftest (default: 3)
  --calls N            timed all-reduces per size and round (default: 200 up to 256 KiB, 50 up
                       to 4 MiB, 20 up to 16 MiB, 10 above; a tenth as many warm up first)
  --quick              64 KiB and 1 MiB, 1 round, 5 calls, few ucx_perftest messages
  --no-peer            do not run ucx_perftest
  --json               one JSON object per line instead of tables
  --peer-script PATH   the ucx_perftest pair (default: bench/peers/ucx_perftest_pair.sh)
)";
}

Expected<AllreduceBenchOptions> parse_allreduce_options(std::span<const std::string> args) {
  AllreduceBenchOptions o;
  bool sizes_set = false, rounds_set = false, calls_set = false;
  const Status parsed = parse_options(args, o, [&](size_t& i) -> Status {
    const std::string& a = args[i];
    if (a == "--sizes") {
      auto v = int_list_option(args, i, 4, static_cast<int>(kMaxBytes));
      if (!v) return v.error();
      std::vector<int64_t> bytes;
      for (int s : *v) {
        if (s % 4 != 0)
          return make_error("--sizes: {} is not a multiple of 4 (the buffers are f32)", s);
        bytes.push_back(s);
      }
      o.sizes = labelled(bytes);
      sizes_set = true;
    } else if (a == "--rounds") {
      auto n = int_option(args, i, 1, 1000);
      if (!n) return n.error();
      o.rounds = *n;
      rounds_set = true;
    } else if (a == "--calls") {
      auto n = int_option(args, i, 1, 1000000);
      if (!n) return n.error();
      o.calls = *n;
      calls_set = true;
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--rank-child") {
      o.rank_child = true;
    } else {
      return make_error("unknown option '{}' (see actorpipe-bench allreduce --help)", a);
    }
    return {};
  });
  if (!parsed) return parsed.error();
  if (o.quick) {
    if (!sizes_set) o.sizes = labelled({int64_t{64} << 10, int64_t{1} << 20});
    if (!rounds_set) o.rounds = 1;
    if (!calls_set) o.calls = 5;
    o.scale = 0.01;
  }
  return o;
}

int allreduce_calls(int64_t bytes, int calls) {
  if (calls > 0) return calls;
  if (bytes <= (int64_t{256} << 10)) return 200;
  if (bytes <= (int64_t{4} << 20)) return 50;
  if (bytes <= (int64_t{16} << 20)) return 20;
  return 10;
}

int allreduce_warmup(int calls) {
  return std::max(1, calls / 10);
}

int64_t allreduce_bytes_sent(int64_t floats, int world) {
  if (world <= 1 || floats <= 0) return 0;
  const int64_t chunk = (floats + world - 1) / world;
  return 2 * (world - 1) * chunk * 4;
}

AllreduceFigures allreduce_figures(int64_t bytes, int64_t bytes_sent_per_call, double seconds) {
  AllreduceFigures f;
  f.seconds = seconds;
  if (seconds > 0) {
    f.alg_bytes_per_s = static_cast<double>(bytes) / seconds;
    f.bus_bytes_per_s = static_cast<double>(bytes_sent_per_call) / seconds;
  }
  return f;
}

AllreduceFigures AllreduceRow::figures() const {
  return allreduce_figures(size.bytes, bytes_sent_per_call,
                           seconds.empty() ? 0.0 : median(seconds));
}

AllreduceFigures AllreduceRow::round(size_t k) const {
  return allreduce_figures(size.bytes, bytes_sent_per_call, seconds.at(k));
}

double AllreduceRow::peer_median() const {
  return peer_bytes_per_s.empty() ? 0.0 : median(peer_bytes_per_s);
}

std::vector<double> AllreduceRow::ratios() const {
  std::vector<double> r;
  for (size_t k = 0; k < std::min(seconds.size(), peer_bytes_per_s.size()); ++k)
    if (peer_bytes_per_s[k] > 0) r.push_back(round(k).bus_bytes_per_s / peer_bytes_per_s[k]);
  return r;
}

std::string allreduce_size_label(int64_t bytes) {
  constexpr int64_t MiB = int64_t{1} << 20, KiB = int64_t{1} << 10;
  if (bytes >= MiB)
    return bytes % MiB == 0 ? fmt::format("{} MiB", bytes / MiB)
                            : fmt::format("{:.1f} MiB", static_cast<double>(bytes) / MiB);
  if (bytes >= KiB)
    return bytes % KiB == 0 ? fmt::format("{} KiB", bytes / KiB)
                            : fmt::format("{:.1f} KiB", static_cast<double>(bytes) / KiB);
  return fmt::format("{} B", bytes);
}

std::string allreduce_table(const std::vector<AllreduceRow>& rows) {
  std::string s = fmt::format("{:<30} {:>6} {:>10} {:>11} {:>11} {:>11} {:>7}  {:<20} {}\n", "size",
                              "calls", "ours ms", "ours alg", "ours bus", "perftest", "ratio",
                              "ratio per round", "other");
  for (const AllreduceRow& r : rows) {
    const AllreduceFigures f = r.figures();
    const std::vector<double> ratios = r.ratios();
    s += fmt::format("{:<30} {:>6} {:>10.3f} {:>11} {:>11} {:>11} {:>7}  {:<20} {}\n",
                     size_cell(r.size), r.calls, f.seconds * 1e3,
                     fmt::format("{:.2f} GB/s", f.alg_bytes_per_s / 1e9),
                     fmt::format("{:.2f} GB/s", f.bus_bytes_per_s / 1e9),
                     r.peer_ran() ? fmt::format("{:.2f} GB/s", r.peer_median() / 1e9) : "-",
                     ratios.empty() ? "-" : fmt::format("{:.0f}%", median(ratios) * 100),
                     ratios.empty() ? r.peer_note : cells(ratios, 0.01, "{:.0f}"), r.other);
  }
  return s;
}

std::string allreduce_rounds_table(const std::vector<AllreduceRow>& rows) {
  std::string s = fmt::format("{:<30} {:>5} {:>10} {:>11} {:>11} {:>7}\n", "size", "round",
                              "ours ms", "ours bus", "perftest", "ratio");
  for (const AllreduceRow& r : rows)
    for (size_t k = 0; k < r.seconds.size(); ++k) {
      const AllreduceFigures f = r.round(k);
      const bool peer = k < r.peer_bytes_per_s.size() && r.peer_bytes_per_s[k] > 0;
      s += fmt::format(
          "{:<30} {:>5} {:>10.3f} {:>11} {:>11} {:>7}\n", size_cell(r.size), k + 1, f.seconds * 1e3,
          fmt::format("{:.2f} GB/s", f.bus_bytes_per_s / 1e9),
          peer ? fmt::format("{:.2f} GB/s", r.peer_bytes_per_s[k] / 1e9) : "-",
          peer ? fmt::format("{:.0f}%", f.bus_bytes_per_s / r.peer_bytes_per_s[k] * 100) : "-");
    }
  return s;
}

int run_allreduce_bench(std::span<const std::string> args) {
  auto parsed = parse_allreduce_options(args);
  if (!parsed) {
    fmt::print(stderr, "actorpipe-bench allreduce: {}\n", parsed.error().message);
    return 2;
  }
  const AllreduceBenchOptions& o = *parsed;
  if (o.help) {
    fmt::print("{}", allreduce_usage());
    return 0;
  }
  if (o.rank_child) return run_rank(o);

  const Interference start = sample_interference(std::chrono::milliseconds(500));
  const std::string machine = describe_machine();
  warn_if_busy("actorpipe-bench", start);
  const bool peer = o.peer && have_ucx_perftest();
  const std::string peer_note =
      o.peer ? (peer ? "" : "ucx_perftest not on PATH (package ucx-utils)") : "--no-peer";
  if (!o.json)
    fmt::print(
        "actorpipe-bench allreduce: GlooGroup::all_reduce_sum (Gloo TCP: alltoall, sum in member "
        "order, allgather) between 2 processes on 127.0.0.1\n"
        "machine: {}; other processes at the start: {} cores\n"
        "sizes: f32 buffers; 'small stage s of 2': GPT small's stage s gradient buffer (every "
        "layer of the stage, tied copy included) of the default 2-stage even partition\n"
        "ours: the slower rank's median call after a tenth as many warm-up calls; alg = buffer "
        "bytes / time, bus = bytes a member sent (GlooGroup::bytes_sent per call, 2(w-1)/w of "
        "the buffer, = the buffer at w = 2) / time; every size's result checked against the "
        "serial sum\n"
        "peer: ucx_perftest -t tag_bw (one direction, client to server) on 127.0.0.1, "
        "UCX_TLS=tcp, the same sizes{}\n"
        "{} round{}, each a fresh two-rank job then ucx_perftest; medians over the rounds; "
        "ratio: median of each round's ours bus / perftest (GB/s = 1e9 B/s)\n",
        machine, interference_cell(start), peer ? "" : fmt::format(" (not run: {})", peer_note),
        o.rounds, o.rounds == 1 ? "" : "s");

  const size_t n = o.sizes.size();
  std::vector<AllreduceRow> rows(n);
  std::vector<Interference> worst(n);
  std::vector<std::string> peer_error(n);
  for (size_t k = 0; k < n; ++k) {
    rows[k].size = o.sizes[k];
    rows[k].calls = allreduce_calls(o.sizes[k].bytes, o.calls);
  }
  int disturbed = 0;
  std::vector<std::string> child = {"allreduce", "--rank-child", "--sizes",
                                    sizes_argument(o.sizes)};
  if (o.calls > 0) child.insert(child.end(), {"--calls", std::to_string(o.calls)});
  for (int round = 0; round < o.rounds; ++round) {
    const CpuSnapshot before = cpu_snapshot();
    auto job = run_rank_job(child, kWorld, {{"OPENBLAS_NUM_THREADS", "1"}});
    if (!job || !job->failure.empty()) {
      fmt::print(stderr, "actorpipe-bench allreduce: round {}: {}\n", round + 1,
                 job ? job->failure : job.error().message);
      return 1;
    }
    std::vector<std::vector<json>> lines(kWorld);
    for (int rank = 0; rank < kWorld; ++rank)
      for (const std::string& l : job->out[static_cast<size_t>(rank)]) {
        auto j = json::parse(l, nullptr, false);
        if (!j.is_discarded() && j.is_object() && j.value("name", "") == "allreduce_rank")
          lines[static_cast<size_t>(rank)].push_back(std::move(j));
      }
    for (int rank = 0; rank < kWorld; ++rank)
      if (lines[static_cast<size_t>(rank)].size() != n) {
        fmt::print(stderr, "actorpipe-bench allreduce: round {}: rank {} reported {} of {} sizes\n",
                   round + 1, rank, lines[static_cast<size_t>(rank)].size(), n);
        return 1;
      }
    const Interference ours = interference(before, cpu_snapshot());
    for (size_t k = 0; k < n; ++k) {
      double slowest = 0.0;
      for (int rank = 0; rank < kWorld; ++rank) {
        const json& j = lines[static_cast<size_t>(rank)][k];
        if (j["bytes"].get<int64_t>() != o.sizes[k].bytes || !j.value("verified", false)) {
          fmt::print(stderr, "actorpipe-bench allreduce: round {}: rank {}: unexpected line {}\n",
                     round + 1, rank, j.dump());
          return 1;
        }
        slowest = std::max(slowest, j["median_s"].get<double>());
      }
      rows[k].seconds.push_back(slowest);
      rows[k].bytes_sent_per_call = lines[0][k]["bytes_sent_per_call"].get<int64_t>();
      if (!peer) continue;
      const CpuSnapshot peer_before = cpu_snapshot();
      const PerftestResult p = run_perftest_bw(o, o.sizes[k].bytes);
      const Interference during = interference(peer_before, cpu_snapshot());
      disturbed += distorted(during) ? 1 : 0;
      if (!worst[k].known || during.other + during.steal > worst[k].other + worst[k].steal)
        worst[k] = during;
      if (!p.ran) {
        peer_error[k] = p.error;
        continue;
      }
      rows[k].peer_bytes_per_s.push_back(p.bytes_per_s);
    }
    disturbed += distorted(ours) ? 1 : 0;
    for (size_t k = 0; k < n; ++k)
      if (!worst[k].known || ours.other + ours.steal > worst[k].other + worst[k].steal)
        worst[k] = ours;
  }

  int failures = 0;
  for (size_t k = 0; k < n; ++k) {
    AllreduceRow& r = rows[k];
    r.other = interference_cell(worst[k]);
    if (peer && !peer_error[k].empty()) {
      fmt::print(stderr, "actorpipe-bench allreduce: ucx_perftest at {} B: {}\n", r.size.bytes,
                 peer_error[k]);
      r.peer_note = "ucx_perftest failed";
      ++failures;
    } else if (!peer) {
      r.peer_note = peer_note;
    }
    if (!o.json) continue;
    const AllreduceFigures f = r.figures();
    json j;
    j["name"] = "allreduce";
    j["machine"] = machine;
    j["bytes"] = r.size.bytes;
    j["label"] = r.size.label;
    j["world"] = kWorld;
    j["calls"] = r.calls;
    j["warmup"] = allreduce_warmup(r.calls);
    j["seconds"] = f.seconds;
    j["seconds_rounds"] = r.seconds;
    j["alg_bytes_per_s"] = f.alg_bytes_per_s;
    j["bus_bytes_per_s"] = f.bus_bytes_per_s;
    j["bytes_sent_per_call"] = r.bytes_sent_per_call;
    j["expected_bytes_sent_per_call"] = allreduce_bytes_sent(r.size.bytes / 4, kWorld);
    j["verified"] = true;
    j["peer_ran"] = r.peer_ran();
    if (r.peer_ran()) {
      j["peer_bytes_per_s"] = r.peer_median();
      j["peer_bytes_per_s_rounds"] = r.peer_bytes_per_s;
      j["ratio"] = median(r.ratios());
      j["ratio_rounds"] = r.ratios();
    } else {
      j["peer_note"] = peer_error[k].empty() ? r.peer_note : peer_error[k];
    }
    add_interference(j, worst[k]);
    fmt::print("{}\n", j.dump());
  }
  if (!o.json)
    fmt::print("\nmedians over {} round{}:\n{}\neach round:\n{}\n{}\n", o.rounds,
               o.rounds == 1 ? "" : "s", allreduce_table(rows), allreduce_rounds_table(rows),
               interference_summary(disturbed));
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}

}  // namespace actorpipe::bench
