// Pipeline timing: runs the actor engine on one configuration and reads the steady-state step
// time from the driver's per-step reports, with a data loader that replays ready microbatches.
#include "bench/pipeline_timing.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "actors/actor_engine.hpp"
#include "bench/machine.hpp"
#include "bench/step_timing.hpp"
#include "engine/execution/stage_worker.hpp"

namespace actorpipe::bench {

namespace {}  // namespace

ReplayLoader::ReplayLoader(DataLoader& source, int pool)
    : vocab_(source.vocab_size()), entropy_(source.entropy_rate()), source_(source.describe()) {
  for (int i = 0; i < std::max(pool, 1); ++i) pool_.push_back(source.next());
}

Microbatch ReplayLoader::next() {
  Microbatch mb = pool_[position_ % pool_.size()];
  mb.index = static_cast<int64_t>(position_);
  ++position_;
  return mb;
}

std::string ReplayLoader::describe() const {
  return fmt::format("{} microbatches of {} replayed in turn", pool_.size(), source_);
}

std::vector<double> step_periods(const std::vector<double>& seconds, int group, int warmup) {
  std::vector<double> out;
  if (group < 1) return out;
  const int K = static_cast<int>(seconds.size()) / group;
  auto t = [&](int k) { return seconds[static_cast<size_t>(k) * group - 1]; };
  for (int k = std::max(warmup, 1); k < K; ++k) out.push_back(t(k + 1) - t(k));
  return out;
}

Expected<PipelineRunResult> measure_pipeline(const PipelineRunSpec& spec) {
  if (spec.warmup < 1 || spec.reps < 1 || spec.runs < 1)
    return make_error("pipeline timing: warmup = {}, reps = {}, runs = {}: expected >= 1",
                      spec.warmup, spec.reps, spec.runs);
  Config c;
  c.model = spec.model;
  c.pipeline.mode = std::string(to_string(spec.mode));
  c.pipeline.stages = spec.stages;
  c.pipeline.microbatches = spec.microbatches;
  c.pipeline.microbatch_size = spec.B;
  c.pipeline.seq_len = spec.T;
  c.pipeline.partition.counts = spec.partition;
  c.pipeline.threads_per_stage = spec.threads_per_stage;
  c.pipeline.split_backward = spec.split_backward;
  c.pipeline.replicas = spec.replicas;
  c.optimizer.delay_correction = spec.delay_correction;
  c.optimizer.momentum_decay = spec.momentum_decay;
  c.optimizer.basis_rotation = spec.basis_rotation;
  c.optimizer.rotation_block = spec.rotation_block;
  c.pipeline.precision = spec.precision;
  // ACTORPIPE_BENCH_SHARED_MEMORY=0: tensors between processes copied by UCX, not lent
  if (const char* v = std::getenv("ACTORPIPE_BENCH_SHARED_MEMORY"); v != nullptr)
    c.cluster.shared_memory = std::string_view(v) != "0";
  ActorEngineOptions o;
  o.skip_compute = spec.skip_compute;
  o.record_spans = spec.record_spans;
  o.stall_timeout_seconds = 900.0;  // a busy machine slows a step, it does not stall it
  // ACTORPIPE_BENCH_RELEASE_AHEAD=0: stages in other processes get releases with the first, to
  // compare (rank_job.cpp: ACTORPIPE_BENCH_CALLER_PROGRESS)
  if (const char* v = std::getenv("ACTORPIPE_BENCH_RELEASE_AHEAD"); v != nullptr)
    o.release_ahead_remote = std::string_view(v) != "0";
  if (const char* v = std::getenv("ACTORPIPE_BENCH_POLL_US"); v != nullptr)
    o.poll_before_wait_us = std::atoi(v);
  // ACTORPIPE_BENCH_REMOTE_MAIL=0: control messages between processes through CAF's middleman
  if (const char* v = std::getenv("ACTORPIPE_BENCH_REMOTE_MAIL"); v != nullptr)
    o.remote_mail = std::string_view(v) != "0";
  // ACTORPIPE_BENCH_CHANNEL_ANNOUNCEMENTS=0: announcements between processes as run messages
  // (as the NCCL channels send them), not on the UCX channels
  if (const char* v = std::getenv("ACTORPIPE_BENCH_CHANNEL_ANNOUNCEMENTS"); v != nullptr)
    o.announce_on_channels = std::string_view(v) != "0";
  auto engine = ActorEngine::create(c, o, spec.group);
  if (!engine) return engine.error();

  const int group = spec.mode == Mode::pipedream ? spec.microbatches : 1;
  const int steps = (spec.warmup + spec.reps) * group;
  const int per_run = (spec.warmup + spec.reps) * spec.microbatches;
  auto source = DataLoader::open(c.data, c.model.arch, c.model.vocab_size, spec.B, spec.T);
  if (!source) return source.error();
  ReplayLoader data(**source, std::min(per_run, 32));

  PipelineRunResult r;
  for (int s = 0; s < c.pipeline.stages; ++s)
    if ((*engine)->local(s))
      r.delay_correction_floats += (*engine)->worker(s).delay_correction_floats();
  auto add_allreduce = [&](const ActorRunResult& run) {
    std::vector<ActionSpan> backwards;
    for (const ActionSpan& a : run.spans)
      if (a.action.kind == ActionKind::B) backwards.push_back(a);
    for (const ReduceSpan& x : run.reduce_spans) r.allreduce_seconds += x.end - x.start;
    r.allreduce_hidden_seconds += hidden_seconds(run.reduce_spans, backwards);
  };
  if (spec.group != nullptr && (*engine)->rank() != 0) {
    // no driver here: this rank's stages compute, rank 0 reports the steps
    for (int run = 0; run < spec.runs; ++run) {
      const double cpu0 = process_cpu_seconds();
      auto result = (*engine)->run(steps, data);
      if (!result) return result.error();
      r.cpu_seconds += process_cpu_seconds() - cpu0;
      r.timed_seconds += result->seconds;
      add_allreduce(*result);
    }
    return r;
  }
  for (int run = 0; run < spec.runs; ++run) {
    std::vector<double> seconds;
    std::vector<std::vector<double>> busy;  // per reported step, per stage (cumulative)
    std::vector<double> cpu;                // process CPU time per reported step
    ActorCallbacks cb;
    cb.on_step = [&](const StepProgress& p) {
      seconds.push_back(p.seconds);
      cpu.push_back(process_cpu_seconds());
      std::vector<double> b;
      for (const StageTimes& s : p.stages) b.push_back(s.busy_seconds);
      busy.push_back(std::move(b));
    };
    auto result = (*engine)->run(steps, data, cb);
    if (!result) return result.error();
    if (static_cast<int>(seconds.size()) != steps)
      return make_error("pipeline timing: {} steps reported, expected {}", seconds.size(), steps);
    if (run == 0 && !result->losses.empty()) r.first_loss = result->losses.front();
    add_allreduce(*result);
    const std::vector<double> periods = step_periods(seconds, group, spec.warmup);
    r.step_seconds_all.insert(r.step_seconds_all.end(), periods.begin(), periods.end());
    const size_t first = static_cast<size_t>(spec.warmup) * group - 1, last = seconds.size() - 1;
    const double window = seconds[last] - seconds[first];
    r.timed_seconds += window;
    r.cpu_seconds += cpu[last] - cpu[first];
    r.stage_busy.clear();
    for (size_t s = 0; s < busy[last].size(); ++s)
      r.stage_busy.push_back(window > 0 ? (busy[last][s] - busy[first][s]) / window : 0.0);
  }
  r.step_seconds = median(r.step_seconds_all);
  r.tokens_per_s = static_cast<double>(spec.microbatches) * spec.B * spec.T / r.step_seconds;
  return r;
}

double hidden_seconds(const std::vector<ReduceSpan>& reduces,
                      const std::vector<ActionSpan>& backwards) {
  std::vector<std::pair<double, double>> busy;
  for (const ActionSpan& b : backwards) busy.emplace_back(b.start, b.end);
  std::sort(busy.begin(), busy.end());
  std::vector<std::pair<double, double>> merged;
  for (const auto& [s, e] : busy) {
    if (!merged.empty() && s <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, e);
    } else {
      merged.emplace_back(s, e);
    }
  }
  double hidden = 0.0;
  for (const ReduceSpan& x : reduces)
    for (const auto& [s, e] : merged)
      hidden += std::max(0.0, std::min(e, x.end) - std::max(s, x.start));
  return hidden;
}

}  // namespace actorpipe::bench
