// Command line of actorpipe-bench: which shapes and thread counts to measure, how many
// repetitions, whether to run the PyTorch peer, print JSON lines or profile a step.
#include "bench/bench_options.hpp"

#include <utility>

#include "bench/bench_shapes.hpp"
#include "bench/cli_args.hpp"
#include "kernels/precision.hpp"

namespace actorpipe::bench {

std::string bench_usage() {
  return R"(usage: actorpipe-bench [options]

Times the reference trainer's full step (forward, backward, AdamW) of a GPT, next to the
GEMM-only floor of the same step and a PyTorch peer running the same model.

  --shapes a,b,...   shapes to measure: tiny, small, gpt2 (default: all three)
  --threads 1,2      thread counts (default: 1,2)
  --precision a,b    what the products compute in: fp32, bf16 (default: both; bf16 only where
                     the CPU has bf16 instructions, docs/modes.md "Precision")
  --reps N           timed steps per configuration, median reported (default: 5)
  --warmup N         untimed steps before timing, at least 1 (default: 1)
  --no-peer          do not run the PyTorch peer
  --json             one JSON object per line per measurement instead of the table
  --profile          also break one step down by kernel category (sampled)
  --python PATH      interpreter of the peer (default: /usr/bin/python3)
  --peer-script PATH the peer script (default: bench/peers/torch_step.py of the source tree)

Other commands (each with --help):
  actorpipe-bench pipeline    every mode on one and two stages, the engine's overhead, PyTorch Pipe
  actorpipe-bench channel     the UCX channel between two processes beside ucx_perftest
  actorpipe-bench processes   two stages as two processes against two stages in one process
  actorpipe-bench migration   the migration manager rebalancing, beside the static optimum
  actorpipe-bench recompute   pipeline.recompute none / auto / all: peak memory and step time
  actorpipe-bench stash       pipeline.stash_precision fp32 / bf16: weight bytes and peak memory
  actorpipe-bench update      the fused optimizer update against its passes run separately
  actorpipe-bench allreduce   the replicas' Gloo all-reduce between two processes beside ucx_perftest
  actorpipe-bench replicas    two processes as 2 replicas and as 2 stages, with the planner's choice
)";
}

Expected<BenchOptions> parse_bench_options(std::span<const std::string> args) {
  BenchOptions o;
  const Status parsed = parse_options(args, o, [&](size_t& i) -> Status {
    const std::string& a = args[i];
    if (a == "--shapes") {
      auto v = option_value(args, i);
      if (!v) return v.error();
      o.shapes.clear();
      for (const std::string& name : split_commas(*v)) {
        auto shape = find_bench_shape(name);
        if (!shape) return shape.error();
        o.shapes.push_back(name);
      }
    } else if (a == "--threads") {
      auto n = int_list_option(args, i, 1, 256);
      if (!n) return n.error();
      o.threads = std::move(*n);
    } else if (a == "--precision") {
      auto v = option_value(args, i);
      if (!v) return v.error();
      o.precisions.clear();
      for (const std::string& name : split_commas(*v)) {
        if (!parse_precision(name))
          return make_error("--precision {}: unknown precision '{}' (allowed: fp32, bf16)", *v,
                            name);
        o.precisions.push_back(name);
      }
    } else if (a == "--reps" || a == "--warmup") {
      auto n = int_option(args, i, 1, 100000);
      if (!n) return n.error();
      (a == "--reps" ? o.reps : o.warmup) = *n;
    } else if (a == "--profile") {
      o.profile = true;
    } else if (a == "--child") {
      o.child = true;
    } else {
      return make_error("unknown option '{}' (see --help)", a);
    }
    return {};
  });
  if (!parsed) return parsed.error();
  return o;
}

}  // namespace actorpipe::bench
