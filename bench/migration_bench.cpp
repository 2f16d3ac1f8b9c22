// `actorpipe-bench migration`: per mode and scenario, a run with the automatic migration manager
// and a run of the static optimum, alternating; medians of the steps before, during and after
// the rebalancing, beside the simulator's predictions.
#include "bench/migration_bench.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "actors/actor_engine.hpp"
#include "bench/bench_shapes.hpp"
#include "bench/machine.hpp"
#include "bench/step_timing.hpp"
#include "engine/data/loader.hpp"
#include "engine/model/model.hpp"
#include "engine/planner/planner.hpp"
#include "engine/profiler/auto_partition.hpp"

namespace actorpipe::bench {

namespace {

using json = nlohmann::ordered_json;

// Targets: after rebalancing within 5% of the static optimum; a move pauses less than a step.
constexpr double kAfterTarget = 0.95;

Config base_config(const MigrationBenchOptions& o, Mode mode) {
  const BenchShape shape = find_bench_shape(o.shape).value();
  Config c;
  c.model = shape.model;
  c.pipeline.mode = std::string(to_string(mode));
  c.pipeline.stages = 2;
  c.pipeline.microbatches = o.microbatches;
  c.pipeline.microbatch_size = shape.B;
  c.pipeline.seq_len = shape.T;
  c.migration.check_every = o.check_every;
  return c;
}

// One run: when each step ended (seconds since the first run() began) and the manager's verdicts.
struct RunTrace {
  std::vector<double> step_end;
  std::vector<MigrationEvent> events;
  std::vector<int> final_partition;
  std::string error;
};

// Trains `steps` steps of `c`; stage 1 computes `slowdown` times slower from step `slow_from`
// on (0: from the start; slowdown 1: never).
RunTrace run_once(const Config& c, int steps, double slowdown, int slow_from) {
  RunTrace t;
  ActorEngineOptions eo;
  if (slowdown > 1.0 && slow_from == 0) {
    eo.slow_stage = 1;
    eo.slowdown = slowdown;
  }
  auto engine = ActorEngine::create(c, eo);
  if (!engine) {
    t.error = engine.error().message;
    return t;
  }
  auto data = DataLoader::open(c.data, c.model.arch, c.model.vocab_size, c.pipeline.microbatch_size,
                               c.pipeline.seq_len);
  if (!data) {
    t.error = data.error().message;
    return t;
  }
  const auto t0 = std::chrono::steady_clock::now();
  ActorCallbacks cb;
  cb.on_step = [&](const StepProgress&) {
    t.step_end.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  cb.on_migration = [&](const MigrationEvent& e) { t.events.push_back(e); };
  std::vector<int> runs = {steps};
  if (slowdown > 1.0 && slow_from > 0) runs = {slow_from, steps - slow_from};
  for (size_t k = 0; k < runs.size(); ++k) {
    if (k == 1) {
      if (Status ok = (*engine)->set_slowdown(1, slowdown); !ok) {
        t.error = ok.error().message;
        return t;
      }
    }
    auto r = (*engine)->run(runs[k], **data, cb);
    if (!r) {
      t.error = r.error().message;
      return t;
    }
  }
  t.final_partition = (*engine)->config().pipeline.partition.counts;
  return t;
}

// step_timing's median, 0 for no values (a window without steps, a run without a move).
double median_or_zero(std::vector<double> xs) {
  return xs.empty() ? 0.0 : median(std::move(xs));
}

// Median duration of steps [first, last) (0-based; step i ends at step_end[i]).
double median_step(const RunTrace& t, int first, int last) {
  std::vector<double> d;
  for (int i = std::max(first, 1); i < last && i < static_cast<int>(t.step_end.size()); ++i)
    d.push_back(t.step_end[static_cast<size_t>(i)] - t.step_end[static_cast<size_t>(i - 1)]);
  return median_or_zero(std::move(d));
}

std::string counts_text(const std::vector<int>& c) {
  return fmt::format("[{}]", fmt::join(c, ", "));
}

}  // namespace

Expected<MigrationBenchOptions> parse_migration_options(std::span<const std::string> args) {
  MigrationBenchOptions o;
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
    } else if (a == "--scenarios") {
      auto v = option_value(args, i);
      if (!v) return v.error();
      o.scenarios.clear();
      for (const std::string& s : split_commas(*v)) {
        if (s != "bad" && s != "slow")
          return make_error("--scenarios: \"{}\" is not a scenario (allowed: bad, slow)", s);
        if (std::find(o.scenarios.begin(), o.scenarios.end(), s) != o.scenarios.end())
          return make_error("--scenarios: \"{}\" given twice", s);
        o.scenarios.push_back(s);
      }
    } else if (a == "--microbatches" || a == "--steps" || a == "--check-every" ||
               a == "--slow-from" || a == "--repeats") {
      auto n = int_option(args, i, 1, 100000);
      if (!n) return n.error();
      (a == "--microbatches"  ? o.microbatches
       : a == "--steps"       ? o.steps
       : a == "--check-every" ? o.check_every
       : a == "--slow-from"   ? o.slow_from
                              : o.repeats) = *n;
    } else if (a == "--slowdown") {
      auto v = option_value(args, i);
      if (!v) return v.error();
      char* end = nullptr;
      const double x = std::strtod(v->c_str(), &end);
      if (end == v->c_str() || *end != '\0' || !(x > 1.0) || !(x <= 100.0))
        return make_error("--slowdown {}: expected a number in (1, 100]", *v);
      o.slowdown = x;
    } else {
      return make_error("unknown option {} (see actorpipe-bench migration --help)", a);
    }
    return {};
  });
  if (!parsed) return parsed.error();
  for (Mode m : o.modes)
    if (m == Mode::twobw && o.microbatches < 2)
      return make_error("--microbatches {}: 2bw needs at least 2 on two stages", o.microbatches);
  if (o.slow_from >= o.steps)
    return make_error("--slow-from {}: must be before --steps {}", o.slow_from, o.steps);
  return o;
}

std::string migration_usage() {
  return R"(usage: actorpipe-bench migration [options]

The automatic migration manager (migration.enabled) on a GPT pipeline of two stages x 1 thread,
beside the planner's static optimum trained the same way, alternating runs:
  bad    start from [1, L-1] (L layers); the manager moves layers until the stages balance;
         the peer is the planner's partition from the start
  slow   start from the planner's partition; from step --slow-from on stage 1 computes
         --slowdown times slower (ActorEngineOptions::slowdown: it spins for the extra time);
         the peer is the planner's partition for that slowdown, slowed from the start
Per run: median step time before the first move, during (from the slowdown or the start to the
move), after (from the second step after the last move) and the peer's over the same steps;
tokens/s after vs the peer's (target >= 95%); the move's pause (target: under one step), its
bytes; the simulator's predicted step of each partition.

options:
  --shape NAME         tiny | small | gpt2 (default small)
  --modes a,b          modes (default 1f1b,2bw)
  --scenarios a,b      bad, slow (default both)
  --microbatches M     m per step (default 4)
  --steps N            steps per run (default 12)
  --check-every N      migration.check_every (default 2; patience 2, threshold 0.15)
  --slowdown X         stage 1's slowdown in "slow" (default 2)
  --slow-from N        the step after which it starts (default 4)
  --repeats N          runs of each configuration, alternating (default 2)
  --json               JSON lines instead of tables
)";
}

int run_migration_bench(std::span<const std::string> args) {
  auto parsed = parse_migration_options(args);
  if (!parsed) {
    fmt::print(stderr, "actorpipe-bench migration: {}\n", parsed.error().message);
    return 2;
  }
  const MigrationBenchOptions& o = *parsed;
  if (o.help) {
    fmt::print("{}", migration_usage());
    return 0;
  }
  const Interference start = sample_interference(std::chrono::milliseconds(500));
  warn_if_busy("actorpipe-bench", start);
  const BenchShape shape = find_bench_shape(o.shape).value();
  auto out = [&](const std::string& s) {
    fmt::print("{}", s);
    std::fflush(stdout);
  };
  if (!o.json) {
    out(fmt::format(
        "actorpipe-bench migration: GPT {} ({}), 2 stages x 1 thread, m = {}, {} steps per run, "
        "check every {} steps\nmachine: {}; other processes at the start: {} cores\n",
        shape.name, shape.describe(), o.microbatches, o.steps, o.check_every, describe_machine(),
        interference_cell(start)));
  }
  int failures = 0;
  for (Mode mode : o.modes) {
    for (const std::string& scenario : o.scenarios) {
      const bool slow = scenario == "slow";
      Config c = base_config(o, mode);
      // the profile (cached) and the planner's static optima, with and without the slowdown
      auto planned = plan_auto_partition(c);
      if (!planned) {
        fmt::print(stderr, "actorpipe-bench migration: {}\n", planned.error().message);
        return 1;
      }
      const int L = Model::build(c.model).value().num_layers();
      const std::vector<int> optimum = planned->result.ranked.front().layers_per_stage;
      PlannerOptions slowed = planned->planner;
      slowed.stage_speed = {1.0, o.slowdown};
      auto slow_plan = plan_partition(planned->costs, slowed);
      if (!slow_plan) {
        fmt::print(stderr, "actorpipe-bench migration: {}\n", slow_plan.error().message);
        return 1;
      }
      const std::vector<int> slow_optimum = slow_plan->ranked.front().layers_per_stage;
      const std::vector<int> from = slow ? optimum : std::vector<int>{1, L - 1};
      const std::vector<int> peer = slow ? slow_optimum : optimum;
      PlannerOptions predict = slow ? slowed : planned->planner;
      const double predicted_from =
          plan_fixed_partition(planned->costs, predict, from).value().predicted_step_seconds;
      const double predicted_peer =
          plan_fixed_partition(planned->costs, predict, peer).value().predicted_step_seconds;

      Config moving = c;
      moving.pipeline.partition.counts = from;
      moving.migration.enabled = true;
      Config fixed = c;
      fixed.pipeline.partition.counts = peer;
      std::vector<double> before, during, after, peer_after, pauses, bytes, ratios;
      std::vector<std::vector<int>> finals;
      std::string error;
      for (int k = 0; k < o.repeats && error.empty(); ++k) {
        RunTrace m = run_once(moving, o.steps, slow ? o.slowdown : 1.0, o.slow_from);
        RunTrace p = run_once(fixed, o.steps, slow ? o.slowdown : 1.0, 0);
        if (!m.error.empty() || !p.error.empty()) {
          error = !m.error.empty() ? m.error : p.error;
          break;
        }
        int first_move = -1, last_move = -1;
        for (const MigrationEvent& e : m.events) {
          if (!e.moved) continue;
          if (first_move < 0) first_move = static_cast<int>(e.step);
          last_move = static_cast<int>(e.step);
          pauses.push_back(e.move_seconds);
          bytes.push_back(static_cast<double>(e.bytes_moved));
        }
        finals.push_back(m.final_partition);
        const int disturbed = slow ? o.slow_from : 0;
        before.push_back(median_step(
            m, 1,
            first_move > 0 ? std::min(first_move, slow ? o.slow_from : first_move) : o.steps));
        if (first_move > 0) {
          during.push_back(median_step(m, disturbed + 1, first_move));
          const int settle = last_move + 1;  // the step after the move carries its pause
          after.push_back(median_step(m, settle + 1, o.steps));
          peer_after.push_back(median_step(p, settle + 1, o.steps));
          ratios.push_back(peer_after.back() / after.back());
        }
      }
      if (!error.empty()) {
        ++failures;
        fmt::print(stderr, "actorpipe-bench migration: {} {}: {}\n", to_string(mode), scenario,
                   error);
        continue;
      }
      const double tokens = static_cast<double>(o.microbatches) * shape.B * shape.T;
      const bool moved = !after.empty();
      const double ratio = median_or_zero(ratios);
      const double pause = median_or_zero(pauses);
      const double after_step = median_or_zero(after);
      const bool met_after = moved && ratio >= kAfterTarget;
      const bool met_pause = moved && pause < after_step;
      std::string final_text;
      for (const auto& f : finals) {
        if (!final_text.empty()) final_text += ' ';
        final_text += counts_text(f);
      }
      if (o.json) {
        json j;
        j["name"] = "migration";
        j["mode"] = to_string(mode);
        j["scenario"] = scenario;
        j["from"] = from;
        j["peer"] = peer;
        j["finals"] = finals;
        j["moved"] = moved;
        j["step_seconds_before"] = median_or_zero(before);
        j["step_seconds_during"] = median_or_zero(during);
        j["step_seconds_after"] = after_step;
        j["peer_step_seconds_after"] = median_or_zero(peer_after);
        j["after_vs_peer"] = ratio;
        j["pause_seconds"] = pause;
        j["bytes_moved"] = median_or_zero(bytes);
        j["predicted_step_from"] = predicted_from;
        j["predicted_step_peer"] = predicted_peer;
        j["met_after"] = met_after;
        j["met_pause"] = met_pause;
        j["ok"] = true;
        out(j.dump() + "\n");
      } else {
        out(fmt::format(
            "\n{} {}: {} -> {} (runs), peer {}\n"
            "  step s (tok/s): before {:.3f} ({:.0f})  during {:.3f}  after {:.3f} ({:.0f})  "
            "peer {:.3f} ({:.0f})\n"
            "  after vs peer: {:.1f}% (target >= 95%: {})\n"
            "  move: pause {:.1f} ms vs a step of {:.0f} ms ({}), {:.1f} MiB moved\n"
            "  simulator: {} {:.3f} s per step, {} {:.3f} s per step\n",
            to_string(mode), scenario, counts_text(from), final_text, counts_text(peer),
            median_or_zero(before), tokens / std::max(median_or_zero(before), 1e-12),
            median_or_zero(during), after_step, tokens / std::max(after_step, 1e-12),
            median_or_zero(peer_after), tokens / std::max(median_or_zero(peer_after), 1e-12),
            ratio * 100,
            !moved      ? "no move"
            : met_after ? "met"
                        : "missed",
            pause * 1e3, after_step * 1e3,
            !moved      ? "no move"
            : met_pause ? "met"
                        : "missed",
            median_or_zero(bytes) / (1 << 20), counts_text(from), predicted_from, counts_text(peer),
            predicted_peer));
      }
    }
  }
  return failures > 0 ? 1 : 0;
}

}  // namespace actorpipe::bench
