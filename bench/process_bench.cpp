// `actorpipe-bench processes`: each configuration runs in fresh processes — the in-process engine
// in one child, the two-process job as two ranks of this program — alternating, repeated.
#include "bench/process_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <utility>

#include "actors/process_group.hpp"
#include "bench/bench_report.hpp"
#include "bench/bench_shapes.hpp"
#include "bench/machine.hpp"
#include "bench/pipeline_timing.hpp"
#include "bench/rank_job.hpp"
#include "bench/step_timing.hpp"
#include "bench/subprocess.hpp"

namespace actorpipe::bench {

namespace {

using json = nlohmann::ordered_json;

// Targets: two processes reach 98% of the in-process tokens/s; the engine's own cost per
// microbatch across processes stays under 50 µs.
constexpr double kThroughputTarget = 0.98;
constexpr double kProcessOverheadMaxUs = 50.0;

PipelineRunSpec spec_of(const ProcessBenchOptions& o) {
  const BenchShape shape = find_bench_shape(o.shape).value();
  PipelineRunSpec spec;
  spec.model = shape.model;
  spec.B = shape.B;
  spec.T = shape.T;
  spec.mode = o.mode;
  spec.stages = 2;
  spec.threads_per_stage = 1;
  spec.microbatches = o.microbatches;
  spec.partition = o.partition;
  spec.warmup = o.warmup;
  spec.reps = o.skip_compute ? o.overhead_steps : o.reps;
  spec.skip_compute = o.skip_compute;
  return spec;
}

json run_json(const PipelineRunSpec& spec, const PipelineRunResult& r) {
  json j;
  j["name"] = "process_run";
  j["tokens_per_s"] = r.tokens_per_s;
  j["step_seconds"] = r.step_seconds;
  j["step_seconds_all"] = r.step_seconds_all;
  j["us_per_microbatch"] = [&] {
    double sum = 0.0;
    for (double s : r.step_seconds_all) sum += s;
    return r.step_seconds_all.empty()
               ? 0.0
               : sum / (static_cast<double>(r.step_seconds_all.size()) * spec.microbatches) * 1e6;
  }();
  j["cpu_seconds"] = r.cpu_seconds;
  j["timed_seconds"] = r.timed_seconds;
  j["stage_busy"] = r.stage_busy;
  j["first_loss"] = r.first_loss;
  return j;
}

// Inside a child: the configuration the options name, in this process or as a rank.
int run_child(const ProcessBenchOptions& o) {
  PipelineRunSpec spec = spec_of(o);
  std::unique_ptr<ProcessGroup> group;
  if (o.rank_child == "ranks") {
    auto joined = join_rank_job();
    if (!joined) {
      fmt::print(stderr, "actorpipe-bench processes: {}\n", joined.error().message);
      return 1;
    }
    group = std::move(*joined);
    spec.group = group.get();
  }
  auto r = measure_pipeline(spec);
  if (!r) {
    fmt::print(stderr, "actorpipe-bench processes: {} {}: {}\n", to_string(o.mode),
               o.rank_child == "ranks" ? "as two processes" : "in one process", r.error().message);
    return 1;
  }
  json j = run_json(spec, *r);
  if (group) {
    j["rank"] = group->rank();
    if (group->rank() != 0) j["name"] = "process_rank";
  }
  fmt::print("{}\n", j.dump());
  std::fflush(stdout);
  if (group) {
    if (Status s = group->leave(); !s) {
      fmt::print(stderr, "actorpipe-bench processes: {}\n", s.error().message);
      return 1;
    }
  }
  return 0;
}

/// The child's arguments for `mode`, in one process ("local") or as ranks ("ranks").
std::vector<std::string> child_args(const ProcessBenchOptions& o, Mode mode,
                                    const std::string& kind, bool skip_compute) {
  std::vector<std::string> a = {"processes",
                                "--rank-child",
                                kind,
                                "--mode",
                                std::string(to_string(mode)),
                                "--shape",
                                o.shape,
                                "--microbatches",
                                std::to_string(o.microbatches),
                                "--reps",
                                std::to_string(o.reps),
                                "--warmup",
                                std::to_string(o.warmup),
                                "--overhead-steps",
                                std::to_string(std::max(o.overhead_steps, 1))};
  if (!o.partition.empty())
    a.insert(a.end(), {"--partition", fmt::format("{},{}", o.partition[0], o.partition[1])});
  if (skip_compute) a.push_back("--skip-compute");
  return a;
}

/// One run: its rank-0 (or only) JSON line, and the other rank's when there is one.
struct Run {
  bool ok = false;
  std::string error;
  json main, other;
  Interference interference;
};

/// `copied`: tensors between the ranks go by copy (cluster.shared_memory = false), not lent.
Run run_config(const ProcessBenchOptions& o, Mode mode, bool ranks, bool skip_compute,
               bool copied = false) {
  Run run;
  std::vector<std::pair<std::string, std::string>> env = {{"OPENBLAS_NUM_THREADS", "1"}};
  if (copied) env.emplace_back("ACTORPIPE_BENCH_SHARED_MEMORY", "0");
  const CpuSnapshot before = cpu_snapshot();
  std::vector<std::string> rank0, rank1;
  if (ranks) {
    auto job = run_rank_job(child_args(o, mode, "ranks", skip_compute), 2, env);
    if (!job || !job->failure.empty()) {
      run.error = job ? job->failure : job.error().message;
      return run;
    }
    rank0 = job->out[0];
    rank1 = job->out[1];
  } else {
    std::vector<std::string> argv = {self_executable()};
    const auto a = child_args(o, mode, "local", skip_compute);
    argv.insert(argv.end(), a.begin(), a.end());
    auto proc = run_process(argv, env);
    if (!proc || proc->exit_code != 0) {
      run.error =
          proc ? fmt::format("exited with status {}", proc->exit_code) : proc.error().message;
      return run;
    }
    rank0 = split_lines(proc->out);
  }
  run.interference = interference(before, cpu_snapshot());
  auto main_line = find_json_line(rank0, "process_run", ranks ? "rank 0" : "the child");
  if (!main_line) {
    run.error = main_line.error().message;
    return run;
  }
  run.main = json::parse(*main_line);
  if (ranks) {
    auto other = find_json_line(rank1, "process_rank", "rank 1");
    if (!other) {
      run.error = other.error().message;
      return run;
    }
    run.other = json::parse(*other);
  }
  run.ok = true;
  return run;
}

std::vector<double> field(const std::vector<Run>& runs, const char* name) {
  std::vector<double> v;
  for (const Run& r : runs) v.push_back(r.main[name].get<double>());
  return v;
}

}  // namespace

std::string process_usage() {
  return R"(usage: actorpipe-bench processes [options]

Two pipeline stages as two processes (two ranks of one job on 127.0.0.1: control messages through
CAF's middleman, tensors on UCX channels) against the same two stages in one process, every mode,
each stage on 1 thread: tokens/s side by side, alternating, each run in fresh processes; then the
engine's own cost per microbatch (the same schedules computing nothing): in one process, in two
with the tensors lent in shared memory (the default) and in two with them copied.
Targets: two processes >= 98% of the in-process tokens/s; < 50 us per microbatch across processes.

  --shape NAME         GPT shape: tiny, small, gpt2 (default: small)
  --modes a,b,...      modes: gpipe, 1f1b, 2bw, pipedream, xpipe (default: all five)
  --microbatches M     microbatches per optimizer step (default: 8)
  --reps N             timed steps per run (default: 3)
  --warmup N           untimed steps first, at least 1 (default: 1)
  --repeats N          runs of each configuration, alternating; medians (default: 2)
  --partition a,b      layers of stage 0 and stage 1 (default: the engine's even split)
  --overhead-steps N   steps of each compute-free run, 0 to skip them (default: 100)
  --no-training        only the compute-free runs
  --json               one JSON object per line instead of tables
)";
}

Expected<ProcessBenchOptions> parse_process_options(std::span<const std::string> args) {
  ProcessBenchOptions o;
  const Status parsed = parse_options(args, o, [&](size_t& i) -> Status {
    const std::string& a = args[i];
    if (a == "--shape") {
      auto v = shape_option(args, i);
      if (!v) return v.error();
      o.shape = *v;
    } else if (a == "--modes") {
      auto modes = modes_option(args, i);
      if (!modes) return modes.error();
      o.modes = std::move(*modes);
    } else if (a == "--mode") {
      auto mode = mode_option(args, i);
      if (!mode) return mode.error();
      o.mode = *mode;
    } else if (a == "--partition") {
      auto v = int_list_option(args, i, 1, 100000);
      if (!v) return v.error();
      if (v->size() != 2)
        return make_error("--partition: {} counts given, expected 2 (stage 0, stage 1)", v->size());
      o.partition = *v;
    } else if (a == "--microbatches" || a == "--reps" || a == "--warmup" || a == "--repeats") {
      auto n = int_option(args, i, 1, 100000);
      if (!n) return n.error();
      (a == "--microbatches" ? o.microbatches
       : a == "--reps"       ? o.reps
       : a == "--warmup"     ? o.warmup
                             : o.repeats) = *n;
    } else if (a == "--overhead-steps") {
      auto n = int_option(args, i, 0, 1000000);
      if (!n) return n.error();
      o.overhead_steps = *n;
    } else if (a == "--no-training") {
      o.training = false;
    } else if (a == "--skip-compute") {
      o.skip_compute = true;
    } else if (a == "--rank-child") {
      auto v = option_value(args, i);
      if (!v) return v.error();
      if (*v != "local" && *v != "ranks")
        return make_error("--rank-child: '{}' is not allowed: expected local or ranks", *v);
      o.rank_child = *v;
    } else {
      return make_error("unknown option '{}' (see actorpipe-bench processes --help)", a);
    }
    return {};
  });
  if (!parsed) return parsed.error();
  if (!o.training && o.overhead_steps == 0)
    return make_error("--no-training with --overhead-steps 0 measures nothing: drop one of them");
  for (Mode m : o.modes)
    if (m == Mode::twobw && o.microbatches < 2)
      return make_error("--microbatches {}: 2bw needs at least 2 on two stages", o.microbatches);
  return o;
}

int run_process_bench(std::span<const std::string> args) {
  auto parsed = parse_process_options(args);
  if (!parsed) {
    fmt::print(stderr, "actorpipe-bench processes: {}\n", parsed.error().message);
    return 2;
  }
  const ProcessBenchOptions& o = *parsed;
  if (o.help) {
    fmt::print("{}", process_usage());
    return 0;
  }
  if (!o.rank_child.empty()) return run_child(o);

  const Interference start = sample_interference(std::chrono::milliseconds(500));
  const std::string machine = describe_machine();
  warn_if_busy("actorpipe-bench", start);
  const BenchShape shape = find_bench_shape(o.shape).value();
  const std::string part = o.partition.empty()
                               ? "the engine's even split"
                               : fmt::format("[{}, {}]", o.partition[0], o.partition[1]);
  int failures = 0, disturbed = 0;
  auto out = [&](const std::string& s) {
    fmt::print("{}", s);
    std::fflush(stdout);
  };
  if (!o.json)
    out(fmt::format(
        "actorpipe-bench processes: GPT {} ({}), 2 stages x 1 thread, partition {}, m = {}\n"
        "machine: {}; other processes at the start: {} cores\n",
        shape.name, shape.describe(), part, o.microbatches, machine, interference_cell(start)));

  if (o.training) {
    if (!o.json)
      out(fmt::format(
          "\ntraining: {} timed steps after {} untimed per run, {} runs of each configuration "
          "alternating, medians; tok/s per run in brackets\n{:<10} {:>22} {:>22} {:>7}  {:<18} "
          "{:<10} {}\n",
          o.reps, o.warmup, o.repeats, "mode", "1 process tok/s", "2 processes tok/s", "ratio",
          "target (>= 98%)", "same loss", "other"));
    for (Mode mode : o.modes) {
      std::vector<Run> local, ranks;
      Interference worst;
      std::string error;
      for (int k = 0; k < o.repeats && error.empty(); ++k) {
        for (bool as_ranks : {false, true}) {
          Run r = run_config(o, mode, as_ranks, false);
          if (!r.ok) {
            error = fmt::format("{}: {}", as_ranks ? "two processes" : "one process", r.error);
            break;
          }
          disturbed += distorted(r.interference) ? 1 : 0;
          if (!worst.known || r.interference.other > worst.other) worst = r.interference;
          (as_ranks ? ranks : local).push_back(std::move(r));
        }
      }
      json j;
      j["name"] = "processes_training";
      j["machine"] = machine;
      j["shape"] = shape.name;
      j["mode"] = std::string(to_string(mode));
      j["microbatches"] = o.microbatches;
      j["ok"] = error.empty();
      if (!error.empty()) {
        ++failures;
        j["error"] = error;
        out(o.json ? j.dump() + "\n" : fmt::format("{:<10} FAILED: {}\n", to_string(mode), error));
        continue;
      }
      const std::vector<double> a = field(local, "tokens_per_s");
      const std::vector<double> b = field(ranks, "tokens_per_s");
      const double ratio = median(b) / median(a);
      bool same_loss = true;
      for (const Run& r : ranks)
        same_loss = same_loss && r.main["first_loss"] == local.front().main["first_loss"];
      j["tokens_per_s_one_process"] = median(a);
      j["tokens_per_s_two_processes"] = median(b);
      j["runs_one_process"] = a;
      j["runs_two_processes"] = b;
      j["ratio"] = ratio;
      j["meets_target"] = ratio >= kThroughputTarget;
      j["same_first_loss"] = same_loss;
      add_interference(j, worst);
      out(o.json ? j.dump() + "\n"
                 : fmt::format("{:<10} {:>8.0f} [{:>11}] {:>8.0f} [{:>11}] {:>6.1f}%  {:<18} "
                               "{:<10} {}\n",
                               to_string(mode), median(a), cells(a, "{:.0f}"), median(b),
                               cells(b, "{:.0f}"), ratio * 100,
                               ratio >= kThroughputTarget ? "ok" : "MISSED",
                               same_loss ? "yes" : "NO", interference_cell(worst)));
      if (!same_loss) ++failures;
    }
  }

  if (o.overhead_steps > 0) {
    if (!o.json)
      out(fmt::format(
          "\nengine overhead: the same schedules with no compute, {} steps after {} untimed, {} "
          "runs of each configuration alternating, medians (runs in brackets);\n  per "
          "microbatch = the timed steps / (steps x m); two processes lend their tensors in "
          "shared memory (the default), \"copied\" sends them as bytes (cluster.shared_memory = "
          "false)\n{:<10} {:>22} {:>22} {:>22} {:>11}  {:<17} {}\n",
          o.overhead_steps, o.warmup, o.repeats, "mode", "1 process us", "2 processes us",
          "copied us", "rank 1 cpu", "target (< 50 us)", "other"));
    for (Mode mode : o.modes) {
      std::vector<Run> local, lent, copied;
      Interference worst;
      std::string error;
      for (int k = 0; k < o.repeats && error.empty(); ++k) {
        for (int kind = 0; kind < 3; ++kind) {
          Run r = run_config(o, mode, kind > 0, true, kind == 2);
          if (!r.ok) {
            error = fmt::format("{}: {}",
                                kind == 0   ? "one process"
                                : kind == 1 ? "two processes"
                                            : "two processes, copied",
                                r.error);
            break;
          }
          disturbed += distorted(r.interference) ? 1 : 0;
          if (!worst.known || r.interference.other > worst.other) worst = r.interference;
          (kind == 0 ? local : kind == 1 ? lent : copied).push_back(std::move(r));
        }
      }
      json j;
      j["name"] = "processes_overhead";
      j["machine"] = machine;
      j["mode"] = std::string(to_string(mode));
      j["microbatches"] = o.microbatches;
      j["ok"] = error.empty();
      if (!error.empty()) {
        ++failures;
        j["error"] = error;
        out(o.json ? j.dump() + "\n" : fmt::format("{:<10} FAILED: {}\n", to_string(mode), error));
        continue;
      }
      const std::vector<double> a = field(local, "us_per_microbatch");
      const std::vector<double> b = field(lent, "us_per_microbatch");
      const std::vector<double> c = field(copied, "us_per_microbatch");
      // rank 1's process CPU over its whole run, in cores: what its threads take while the
      // stage computes nothing (waits, messages, the UCX progress thread)
      std::vector<double> cores;
      for (const Run& r : lent) {
        const double t1 = r.other["timed_seconds"].get<double>();
        cores.push_back(t1 > 0 ? r.other["cpu_seconds"].get<double>() / t1 : 0.0);
      }
      const double us_b = median(b);
      j["us_per_microbatch_one_process"] = median(a);
      j["us_per_microbatch_two_processes"] = us_b;
      j["us_per_microbatch_two_processes_copied"] = median(c);
      j["runs_one_process"] = a;
      j["runs_two_processes"] = b;
      j["runs_two_processes_copied"] = c;
      j["rank1_cores"] = median(cores);
      j["meets_target"] = us_b < kProcessOverheadMaxUs;
      add_interference(j, worst);
      out(o.json ? j.dump() + "\n"
                 : fmt::format("{:<10} {:>7.1f} [{:>12}] {:>7.1f} [{:>12}] {:>7.1f} [{:>12}] "
                               "{:>10.2f}   {:<17} {}\n",
                               to_string(mode), median(a), cells(a, "{:.0f}"), us_b,
                               cells(b, "{:.0f}"), median(c), cells(c, "{:.0f}"), median(cores),
                               us_b < kProcessOverheadMaxUs ? "ok" : "MISSED",
                               interference_cell(worst)));
    }
  }
  if (!o.json) out(fmt::format("\n{}\n", interference_summary(disturbed)));
  return failures == 0 ? 0 : 1;
}

}  // namespace actorpipe::bench
