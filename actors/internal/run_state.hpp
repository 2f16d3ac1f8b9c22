// Run state: what the driver, the stage actors and the optimizer shards of one process share in
// a run: the action lists, the workers, the channels, the microbatch feed, the actor directory.
#pragma once

#include <atomic>
#include <caf/actor.hpp>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actors/actor_engine.hpp"
#include "engine/schedule/schedule.hpp"
#include "transport/channel.hpp"

namespace actorpipe {

class GradientReducer;
class OptimizerShard;
class StageWorker;

namespace internal {

class MicrobatchFeed;
class RemoteMail;

/// One action of a stage's run-wide list: the schedule's action and where it sits in the run.
struct StageStep {
  Action action;        ///< as in the schedule (microbatch and version schedule-local)
  int repeat = 0;       ///< which repetition of the schedule (sync modes: the step)
  int64_t mb = -1;      ///< run-local microbatch index, -1 for OPT_STEP and FLUSH
  bool starts = false;  ///< first action of its repetition at this stage
};

/// Counters a stage publishes while it runs (read by the driver for progress and stalls).
struct StageCounters {
  std::atomic<int64_t> busy_ns{0};
  std::atomic<int64_t> idle_ns{0};
  std::atomic<int64_t> actions{0};
  std::atomic<int> pc{0};  ///< index of the action the stage is at
};

/// Every actor of the run, filled in before the first message is sent.
struct Directory {
  caf::actor driver;
  std::vector<caf::actor> stages;
  std::vector<caf::actor> optimizers;
  /// pipeline.replicas > 1: every replica's driver, by replica (replica 0's combines the step
  /// losses); empty otherwise.
  std::vector<caf::actor> drivers;
};

/// Shared by every actor of one run. Immutable while the run goes, except for the atomics, the
/// spans (each stage and each shard writes only its own list), the workers (each used by its
/// stage actor's thread only; an open update's job by the stage's shard) and the shards (each
/// used by its shard actor only).
struct RunState {
  ActorEngineOptions options;
  Mode mode = Mode::onef1b;
  int stages = 0;
  std::vector<int> rank_of_stage;  ///< the process (rank) each stage runs in (all 0: one process)
  int driver_rank = 0;             ///< the process the driver runs in (its replica's first)
  int rank = 0;                    ///< the process this run state belongs to
  /// Control messages between this process's actors and those of other processes travel here
  /// (send_to, actors/internal/remote_mail.hpp); null: all through CAF (one process, or no
  /// UCX worker).
  RemoteMail* mail = nullptr;
  /// pipeline.replicas: this pipeline is replica `replica` of `replicas`; its shards sum their
  /// gradients through `reducer` (null with one replica, and in evaluations).
  int replicas = 1;
  int replica = 0;
  GradientReducer* reducer = nullptr;
  int group = 1;              ///< microbatches per optimizer step (the loss of a step)
  int64_t total_mbs = 0;      ///< microbatches of the run
  int64_t global_offset = 0;  ///< data position of run-local microbatch 0
  int B = 1, T = 1;           ///< microbatch shape
  int64_t tokens_per_mb = 0;  ///< B·T
  int credits = 1;            ///< microbatches released ahead of stage 0's backwards
  float grad_clip = 0.0f;
  bool split_backward = true;  ///< pipeline.split_backward: B hands din on before its weight half
  /// train.nonfinite = "skip" (sync modes): a step whose loss or gradients are not finite is
  /// dropped on every stage (the driver sends each shard kSkipScale: skip_update)
  bool skip_nonfinite = false;
  /// A held-out evaluation (ActorEngine::evaluate): a forward-only schedule whose F computes
  /// StageWorker::evaluate (no stash, no update, no tied hand-over); every microbatch is its own
  /// "step" of one, whose loss is its mean, and no stage starts a worker run.
  bool eval = false;
  Schedule schedule;  ///< lowered; sync modes run it once per step (`repeats` times)
  int repeats = 1;
  /// Asynchronous modes, per stage: the run cut short after fewer steps (the driver's cut:
  /// first_steps(schedule, k)), which the stage's list then is (list()); null while it is not.
  /// Set by the stage's own actor (shorten()), read by it and by the stage's optimizer actor on
  /// its own thread: an atomic pointer, whose schedule lives as long as the run state.
  std::unique_ptr<std::atomic<const Schedule*>[]> shortened;
  /// Their storage: every schedule a stage was shortened to, kept until the run state goes (a
  /// reader may still hold the list of an earlier one).
  std::vector<std::unique_ptr<const Schedule>> shortened_schedules;
  std::mutex shortened_mutex;  ///< guards shortened_schedules
  /// Set (from any thread) when the migration manager decided to move layers: the driver ends
  /// the run after the step in flight, in every mode (RunOutcome::cut). Null: never.
  std::shared_ptr<std::atomic<bool>> cut_request;
  std::vector<StageWorker*> workers;
  std::vector<OptimizerShard*> shards;  ///< per stage: its optimizer state
  ChannelSet* channels = nullptr;
  MicrobatchFeed* feed = nullptr;
  ActorCallbacks callbacks;
  Directory directory;
  std::chrono::steady_clock::time_point start;
  std::unique_ptr<StageCounters[]> counters;
  std::atomic<int64_t> progress{0};                   ///< bumped by every action and every update
  std::vector<std::vector<ActionSpan>> spans;         ///< per stage (record_spans)
  std::vector<std::vector<ActionSpan>> update_spans;  ///< per stage's shard (record_spans)

  double seconds_since_start() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  int64_t global_mb(int64_t mb) const { return mb < 0 ? -1 : global_offset + mb; }
  /// How long an actor polls its mailbox before its thread sleeps (spin_for_mail).
  std::chrono::microseconds spin_budget() const {
    return std::chrono::microseconds(options.spin_before_wait_us);
  }
  /// How long a stage waits for a message before its thread sleeps: polling the transport of
  /// its channels from other processes when they have one (spin_for_mail with a poller).
  std::chrono::microseconds stage_spin_budget() const {
    return channels != nullptr && channels->poller() != nullptr
               ? std::chrono::microseconds(options.poll_before_wait_us)
               : spin_budget();
  }
  /// Actions stage r runs in the run.
  size_t actions(int r) const { return list(r).size() * static_cast<size_t>(repeats); }
  /// Stage r's list of one repetition: the schedule's, or its shortened one.
  const std::vector<Action>& list(int r) const {
    const size_t k = static_cast<size_t>(r);
    const Schedule* cut = shortened ? shortened[k].load(std::memory_order_acquire) : nullptr;
    return cut != nullptr ? cut->per_stage[k] : schedule.per_stage[k];
  }
  /// Stage r's list becomes `cut`'s (its own actor only; allocate_shortened() first).
  void shorten(int r, Schedule cut) {
    const Schedule* kept = nullptr;
    {
      std::lock_guard<std::mutex> lock(shortened_mutex);
      shortened_schedules.push_back(std::make_unique<const Schedule>(std::move(cut)));
      kept = shortened_schedules.back().get();
    }
    shortened[static_cast<size_t>(r)].store(kept, std::memory_order_release);
  }
  /// No stage shortened, for `count` stages (before the run's actors start).
  void allocate_shortened(int count) {
    shortened = std::make_unique<std::atomic<const Schedule*>[]>(static_cast<size_t>(count));
    for (int r = 0; r < count; ++r) shortened[static_cast<size_t>(r)].store(nullptr);
  }
  /// Stage r's pc-th action of the run (pc < actions(r)).
  StageStep step(int r, size_t pc) const {
    const auto& list = this->list(r);
    StageStep s;
    s.action = list[pc % list.size()];
    s.repeat = static_cast<int>(pc / list.size());
    s.mb =
        s.action.microbatch < 0
            ? -1
            : static_cast<int64_t>(s.repeat) * schedule.total_microbatches() + s.action.microbatch;
    s.starts = pc % list.size() == 0;
    return s;
  }
};

/// The message of a caught exception ("unknown exception" for a non-std one).
inline std::string exception_text(std::exception_ptr ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
  }
  return "unknown exception";
}

/// Stage r's times so far, from its counters.
StageTimes stage_times(const RunState& st, int r);

}  // namespace internal
}  // namespace actorpipe
