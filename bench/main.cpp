// actorpipe-bench: times the reference trainer's full step at named GPT shapes and thread
// counts, next to its GEMM-only floor and a PyTorch peer; a table or JSON lines.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/allreduce_bench.hpp"
#include "bench/bench_options.hpp"
#include "bench/bench_report.hpp"
#include "bench/channel_bench.hpp"
#include "bench/cpu_speeds.hpp"
#include "bench/machine.hpp"
#include "bench/migration_bench.hpp"
#include "bench/pipeline_bench.hpp"
#include "bench/process_bench.hpp"
#include "bench/recompute_bench.hpp"
#include "bench/replica_bench.hpp"
#include "bench/stash_bench.hpp"
#include "bench/step_timing.hpp"
#include "bench/subprocess.hpp"
#include "bench/torch_peer.hpp"
#include "bench/update_bench.hpp"
#include "kernels/bf16_gemm.hpp"
#include "kernels/blas_core.hpp"
#include "kernels/gemm.hpp"

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {

// Child mode: measure shapes[0] at threads[0] here, print one JSON line.
int run_child(const BenchOptions& o) {
  auto shape = find_bench_shape(o.shapes.at(0));
  if (!shape) {
    fmt::print(stderr, "actorpipe-bench: {}\n", shape.error().message);
    return 2;
  }
  try {
    auto r = measure_step(*shape, o.threads.at(0), *parse_precision(o.precisions.at(0)), o.reps,
                          o.warmup, o.profile);
    if (!r) {
      fmt::print(stderr, "actorpipe-bench: {}\n", r.error().message);
      return 1;
    }
    fmt::print("{}\n", to_json(*r).dump());
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "actorpipe-bench: {} at {} threads: {}\n", shape->name, o.threads.at(0),
               e.what());
    return 1;
  }
}

// Runs one configuration of actorpipe in a fresh child process (its own peak RSS).
Expected<StepResult> measure_in_child(const BenchOptions& o, const std::string& shape, int threads,
                                      const std::string& precision) {
  std::vector<std::string> argv = {self_executable(), "--child",
                                   "--shapes",        shape,
                                   "--threads",       std::to_string(threads),
                                   "--precision",     precision,
                                   "--reps",          std::to_string(o.reps),
                                   "--warmup",        std::to_string(o.warmup)};
  if (o.profile) argv.push_back("--profile");
  // The Context partitions GEMMs itself and keeps OpenBLAS single-threaded; no idle
  // OpenBLAS threads either.
  auto proc = run_process(argv, {{"OPENBLAS_NUM_THREADS", "1"}});
  if (!proc) return proc.error();
  if (proc->exit_code != 0)
    return make_error("{} at {} threads: the measuring process exited with status {}", shape,
                      threads, proc->exit_code);
  auto j = nlohmann::json::parse(proc->out, nullptr, false);
  if (j.is_discarded())
    return make_error("{} at {} threads: unreadable measurement '{}'", shape, threads,
                      proc->out.substr(0, 200));
  return step_result_from_json(j);
}

}  // namespace

int main(int argc, char** argv) {
  // OpenBLAS's kernels chosen again where it picked narrower ones than the CPU has, before
  // anything computes; every command measures with the kernels a trainer would use
  (void)use_fitting_blas_core();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "pipeline")
    return run_pipeline_bench(std::span<const std::string>(args).subspan(1));
  if (!args.empty() && args[0] == "migration")
    return run_migration_bench(std::span<const std::string>(args).subspan(1));
  if (!args.empty() && args[0] == "channel")
    return run_channel_bench(std::span<const std::string>(args).subspan(1));
  if (!args.empty() && args[0] == "processes")
    return run_process_bench(std::span<const std::string>(args).subspan(1));
  if (!args.empty() && args[0] == "recompute")
    return run_recompute_bench(std::span<const std::string>(args).subspan(1));
  if (!args.empty() && args[0] == "stash")
    return run_stash_bench(std::span<const std::string>(args).subspan(1));
  if (!args.empty() && args[0] == "update")
    return run_update_bench(std::span<const std::string>(args).subspan(1));
  if (!args.empty() && args[0] == "replicas")
    return run_replica_bench(std::span<const std::string>(args).subspan(1));
  if (!args.empty() && args[0] == "allreduce")
    return run_allreduce_bench(std::span<const std::string>(args).subspan(1));
  auto parsed = parse_bench_options(args);
  if (!parsed) {
    fmt::print(stderr, "actorpipe-bench: {}\n", parsed.error().message);
    return 2;
  }
  const BenchOptions& o = *parsed;
  if (o.help) {
    fmt::print("{}", bench_usage());
    return 0;
  }
  if (o.child) return run_child(o);

  const Interference start = sample_interference(std::chrono::milliseconds(500));
  const std::string machine = describe_machine();
  warn_if_busy("actorpipe-bench", start);
  const std::string script = peer_script_path(o.peer_script, "torch_step.py");
  // where bf16 rows run: each CPU's product speed (they need not be equal on a virtual machine)
  const bool bf16_rows =
      bf16_support().native &&
      std::find(o.precisions.begin(), o.precisions.end(), "bf16") != o.precisions.end();
  const std::vector<CpuSpeed> cpu_speeds =
      bf16_rows ? measure_cpu_speeds() : std::vector<CpuSpeed>{};
  if (!o.json) {
    fmt::print(
        "actorpipe-bench: reference trainer step (forward, backward, AdamW), one "
        "microbatch per step,\n  median of {} timed steps after {} warm-up step{}, each "
        "configuration in a fresh process\n",
        o.reps, o.warmup, o.warmup == 1 ? "" : "s");
    fmt::print("machine: {}; other processes at the start: {} cores\n", machine,
               interference_cell(start));
    fmt::print(
        "GFLOP/s: model FLOPs 6*N*tokens + 12*L*T*d*tokens (N: parameters without the "
        "position table)\n");
    fmt::print(
        "floor: the step's own sgemm (and bf16: oneDNN matmul) calls replayed alone, each on the "
        "thread that made it (the pieces each thread took in the step; one thread per call)\n");
    fmt::print("bf16: {}{}\n", bf16_support().describe(),
               bf16_support().native ? "" : " (bf16 rows skipped: no bf16 instructions)");
    if (!cpu_speeds.empty())
      fmt::print("bf16 per CPU: 512x768 . 768x768 on one thread pinned to each: {}\n",
                 describe_cpu_speeds(cpu_speeds));
    if (!uneven_warning(cpu_speeds).empty())
      fmt::print(stderr, "actorpipe-bench: warning: {}\n", uneven_warning(cpu_speeds));
    if (!shared_units_warning(cpu_speeds).empty())
      fmt::print(stderr, "actorpipe-bench: warning: {}\n", shared_units_warning(cpu_speeds));
    const int align = gemm_row_align();
    fmt::print("fp32: {}, {}\n", blas_core().describe(),
               align > 0 ? fmt::format("products split between threads in blocks of {} rows "
                                       "(gemm_row_align)",
                                       align)
                         : std::string("products never split (no row alignment keeps the bits)"));
    if (!blas_core().warning().empty())
      fmt::print(stderr, "actorpipe-bench: warning: {}\n", blas_core().warning());
    if (o.peer) {
      fmt::print("peer: PyTorch, the same GPT and step, one child process per configuration:\n");
      for (int t : o.threads) fmt::print("  {}\n", describe_peer_command(o.python, script, t));
      fmt::print(
          "  bf16 rows: the same with --bf16 (its forward under torch.autocast(cpu, bfloat16))\n");
    }
    fmt::print("\n{}", table_header());
    std::fflush(stdout);
  }

  int failures = 0;
  bool peer_missing = !o.peer;
  std::string peer_missing_reason = o.peer ? "" : "skipped (--no-peer)";
  std::vector<Measurement> done;
  int disturbed = 0;  // measurements during which other work took kBusyCores or more
  for (const std::string& name : o.shapes) {
    const BenchShape shape = find_bench_shape(name).value();
    for (int t : o.threads) {
      for (const std::string& precision : o.precisions) {
        if (precision == "bf16" && !bf16_support().native) continue;
        const CpuSnapshot before = cpu_snapshot();
        auto ours = measure_in_child(o, name, t, precision);
        if (!ours) {
          fmt::print(stderr, "actorpipe-bench: {}\n", ours.error().message);
          ++failures;
          continue;
        }
        Measurement m{shape, std::move(*ours), {}, {}};
        // the peer runs the same step in the same precision (bf16: PyTorch's CPU autocast)
        const bool bf16 = precision == "bf16";
        if (!peer_missing) {
          m.peer = run_torch_peer(o.python, script, shape, OptimizerOptions{}, t, o.reps, o.warmup,
                                  bf16);
          if (!m.peer.ran) {
            fmt::print(stderr, "actorpipe-bench: PyTorch peer: {}\n", m.peer.error);
            if (m.peer.missing) {
              peer_missing = true;
              peer_missing_reason = m.peer.error;
            }
          } else if (m.peer.parameters != m.ours.parameters) {
            fmt::print(stderr,
                       "actorpipe-bench: warning: the peer's model has {} parameters, "
                       "actorpipe's {}\n",
                       m.peer.parameters, m.ours.parameters);
          }
        } else if (o.peer) {
          m.peer.error = peer_missing_reason;
        }
        m.other = interference(before, cpu_snapshot());
        disturbed += distorted(m.other) ? 1 : 0;
        if (o.json) {
          nlohmann::ordered_json j = measurement_json(m);
          j["machine"] = machine;
          nlohmann::ordered_json at_start;
          add_interference(at_start, start);
          j["interference_at_start"] = at_start;
          if (!cpu_speeds.empty()) j["cpu_speeds"] = to_json(cpu_speeds);
          if (m.peer.ran) j["peer_command"] = describe_peer_command(o.python, script, t, bf16);
          fmt::print("{}\n", j.dump());
        } else {
          fmt::print("{}", table_row(m));
        }
        std::fflush(stdout);
        done.push_back(std::move(m));
      }
    }
  }

  if (!o.json) {
    if (o.peer && peer_missing)
      fmt::print("\nPyTorch peer missing: {}; actorpipe's figures only.\n", peer_missing_reason);
    for (const Measurement& m : done) {
      if (!m.ours.floor_ok)
        fmt::print("\nno GEMM floor for {}: {}\n", m.shape.name, m.ours.floor_note);
      if (m.ours.profile) fmt::print("\n{}", profile_table(m));
    }
    fmt::print("\n{}\n", interference_summary(disturbed));
  }
  return failures == 0 ? 0 : 1;
}
