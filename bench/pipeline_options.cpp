// Command line of `actorpipe-bench pipeline`: parsing and the help text.
// Every error names the option, the value and what is allowed.
#include "bench/pipeline_options.hpp"

#include <algorithm>
#include <utility>

#include "bench/bench_shapes.hpp"
#include "bench/cli_args.hpp"
#include "bench/correction_bench.hpp"

namespace actorpipe::bench {

namespace {

// --only-corrections' list: known names (a correction some asynchronous mode takes), each once
Expected<std::vector<std::string>> correction_list(const std::string& value) {
  const std::vector<std::string> known = corrections_of(Mode::pipedream);
  std::vector<std::string> names;
  for (const std::string& name : split_commas(value)) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      return make_error("--only-corrections: unknown correction '{}' in '{}' (known: {})", name,
                        value, list);
    }
    if (std::find(names.begin(), names.end(), name) != names.end())
      return make_error("--only-corrections: '{}' is listed twice in '{}'", name, value);
    names.push_back(name);
  }
  return names;
}

}  // namespace

std::string pipeline_usage() {
  return R"(usage: actorpipe-bench pipeline [options]

Pipeline efficiency of the actor engine on this machine: a GPT trained in every mode as one
stage on 1 thread, one stage on 2 threads and two stages on 1 thread each, gpipe and 1f1b also
with a one-pass backward (pipeline.split_backward = false) (tokens/s, ratios, the ideal
m/(m+d-1)*d of the flushing modes), next to PyTorch's GPipe (Pipe, 2 partitions);
the engine's own cost per microbatch (the same schedules computing nothing); the simulator's
prediction from a per-layer profile against each measurement.

  --shape NAME         GPT shape: tiny, small, gpt2 (default: small)
  --modes a,b,...      modes: gpipe, 1f1b, 2bw, pipedream, xpipe (default: all five)
  --microbatches M     microbatches per optimizer step (default: 8)
  --reps N             timed steps per configuration, median reported (default: 3)
  --warmup N           untimed steps first, at least 1 (default: 1; the --corrections rows: 3)
  --partition a,b      layers of stage 0 and stage 1 in the two-stage runs (embedding, each
                       block and the head count 1; default: balanced by the profile)
  --overhead-steps N   steps of each compute-free run, 0 to skip them (default: 100)
  --overhead-only      only the profile and the compute-free runs: no training runs, no peer
  --profile-reps N     timed calls per layer and pass in the profile (default: 3)
  --corrections N      also each asynchronous mode on 2 stages without and with each delay
                       correction (optimizer.delay_correction; nadam: nesterov with
                       optimizer.momentum_decay 0.004), N rounds interleaved: tokens/s, the
                       floats kept, the cost of an update (default: 0, none)
  --only-corrections a,b,...
                       only these corrections in the --corrections rows, besides none, the
                       reference (default: every one a mode takes: none, nesterov, nadam, dc,
                       secant, dc+nesterov, secant+nesterov, rot, rot+nesterov, rot32,
                       rot32+nesterov; xpipe takes no dc or secant)
  --precisions N       also every mode on 2 stages in fp32 and in bf16 (pipeline.precision), N
                       rounds interleaved: tokens/s and the ratio (default: 0, none; bf16 rows
                       only where the CPU has bf16 instructions)
  --no-peer            do not run PyTorch's Pipe
  --json               one JSON object per line instead of tables
  --python PATH        interpreter of the peer (default: /usr/bin/python3)
  --peer-script PATH   the peer (default: bench/peers/torch_pipe.py of the source tree)
)";
}

int correction_warmup(const PipelineBenchOptions& o) {
  return o.warmup_given ? o.warmup : kCorrectionWarmup;
}

Expected<PipelineBenchOptions> parse_pipeline_options(std::span<const std::string> args) {
  PipelineBenchOptions o;
  const Status parsed = parse_options(args, o, [&](size_t& i) -> Status {
    const std::string& a = args[i];
    if (a == "--shape") {
      auto v = option_value(args, i);
      if (!v) return v.error();
      if (!find_bench_shape(*v)) {
        std::string known;
        for (const BenchShape& s : bench_shapes()) known += (known.empty() ? "" : ", ") + s.name;
        return make_error("--shape: unknown shape '{}' (known: {})", *v, known);
      }
      o.shape = *v;
    } else if (a == "--modes") {
      auto modes = modes_option(args, i);
      if (!modes) return modes.error();
      o.modes = std::move(*modes);
    } else if (a == "--partition") {
      auto v = option_value(args, i);
      if (!v) return v.error();
      auto counts = parse_int_list("--partition", *v, 1, 100000);
      if (!counts) return counts.error();
      o.partition = std::move(*counts);
      if (o.partition.size() != 2)
        return make_error("--partition: '{}' has {} counts, expected 2 (stage 0, stage 1)", *v,
                          o.partition.size());
    } else if (a == "--microbatches" || a == "--reps" || a == "--warmup" || a == "--profile-reps") {
      auto n = int_option(args, i, 1, 100000);
      if (!n) return n.error();
      (a == "--microbatches" ? o.microbatches
       : a == "--reps"       ? o.reps
       : a == "--warmup"     ? o.warmup
                             : o.profile_reps) = *n;
      if (a == "--warmup") o.warmup_given = true;
    } else if (a == "--corrections" || a == "--precisions") {
      auto n = int_option(args, i, 1, 1000);
      if (!n) return n.error();
      (a == "--corrections" ? o.correction_rounds : o.precision_rounds) = *n;
    } else if (a == "--only-corrections") {
      auto v = option_value(args, i);
      if (!v) return v.error();
      auto names = correction_list(*v);
      if (!names) return names.error();
      o.only_corrections = std::move(*names);
    } else if (a == "--overhead-only") {
      o.overhead_only = true;
    } else if (a == "--overhead-steps") {
      auto n = int_option(args, i, 0, 1000000);
      if (!n) return n.error();
      o.overhead_steps = *n;
    } else {
      return make_error("pipeline: unknown option '{}' (see actorpipe-bench pipeline --help)", a);
    }
    return {};
  });
  if (!parsed) return parsed.error();
  if (!o.only_corrections.empty() && o.correction_rounds == 0)
    return make_error(
        "--only-corrections without --corrections N measures nothing: add "
        "--corrections or drop --only-corrections");
  if (o.overhead_only && o.overhead_steps == 0)
    return make_error("--overhead-only with --overhead-steps 0 measures nothing: drop one of them");
  for (Mode m : o.modes) {
    if (m == Mode::twobw && o.microbatches < 2)
      return make_error(
          "--microbatches {}: 2bw needs at least 2 (one per stage of the two-stage "
          "runs); drop 2bw from --modes or raise --microbatches",
          o.microbatches);
  }
  return o;
}

}  // namespace actorpipe::bench
