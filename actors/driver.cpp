// Driver actor: microbatch feed with credits, loss gathering, global clip scale, flush barrier,
// progress callbacks, the stall watchdog and the first-failure-wins shutdown.
#include "actors/driver.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <map>
#include <set>

#include "actors/internal/messages.hpp"
#include "actors/internal/remote_mail.hpp"
#include "actors/internal/run_state.hpp"
#include "actors/internal/spin_wait.hpp"
#include "engine/data/loader.hpp"
#include "engine/execution/nonfinite.hpp"
#include "engine/execution/replicated_executor.hpp"
#include "engine/execution/stage_worker.hpp"
#include "engine/model/layer.hpp"
#include "kernels/check.hpp"
#include "kernels/optimizer.hpp"

namespace actorpipe {
namespace internal {

StageTimes stage_times(const RunState& st, int r) {
  const StageCounters& c = st.counters[static_cast<size_t>(r)];
  StageTimes t;
  t.busy_seconds = static_cast<double>(c.busy_ns.load(std::memory_order_relaxed)) * 1e-9;
  t.idle_seconds = static_cast<double>(c.idle_ns.load(std::memory_order_relaxed)) * 1e-9;
  t.actions = c.actions.load(std::memory_order_relaxed);
  return t;
}

}  // namespace internal

namespace {

using namespace internal;
constexpr auto kTick = std::chrono::milliseconds(50);
constexpr auto kStatusWait = std::chrono::seconds(2);

class DriverActor : public caf::event_based_actor {
 public:
  DriverActor(caf::actor_config& cfg, std::shared_ptr<RunState> st)
      : caf::event_based_actor(cfg), st_(std::move(st)) {
    set_exception_handler([this](caf::scheduled_actor*, std::exception_ptr& ep) -> caf::error {
      const std::string what = exception_text(ep);
      fail(Failure{-1, -1, "", "driver: " + what});
      return caf::make_error(caf::sec::runtime_error, what);
    });
    set_down_handler([this](caf::down_msg& dm) {
      if (finished_) return;
      int stage = -1;
      std::string who = "an actor";
      for (int r = 0; r < st_->stages; ++r) {
        if (dm.source == st_->directory.stages[static_cast<size_t>(r)]) {
          stage = r;
          who = fmt::format("the actor of stage {}", r);
        } else if (dm.source == st_->directory.optimizers[static_cast<size_t>(r)]) {
          stage = r;
          who = fmt::format("the optimizer shard of stage {}", r);
        }
      }
      std::string cause = fmt::format("{} stopped: {}", who, to_string(dm.reason));
      if (stage >= 0 && dm.reason == caf::make_error(caf::exit_reason::remote_link_unreachable)) {
        const int rank = st_->rank_of_stage[static_cast<size_t>(stage)];
        cause = fmt::format("rank {} was lost: {}", rank, cause);
        note_lost(cause);
        lost_ranks_.insert(rank);
      }
      fail_with_status(Failure{stage, -1, "", std::move(cause)});
    });
  }

  caf::behavior make_behavior() override {
    return {
        [this](run_atom) -> caf::result<RunOutcome> {
          promise_ = make_response_promise<RunOutcome>();
          for (const caf::actor& a : st_->directory.stages) monitor(a);
          for (const caf::actor& a : st_->directory.optimizers) monitor(a);
          end_mbs_ = st_->total_mbs;
          losses_.assign(static_cast<size_t>(st_->total_mbs), LossStats{});
          have_loss_.assign(static_cast<size_t>(st_->total_mbs), false);
          commits_.assign(static_cast<size_t>(st_->stages), {});
          times_.assign(static_cast<size_t>(st_->stages), StageTimes{});
          any_remote_ = std::any_of(st_->rank_of_stage.begin(), st_->rank_of_stage.end(),
                                    [&](int rank) { return rank != st_->driver_rank; });
          feed();
          last_progress_ = -1;
          last_change_ = std::chrono::steady_clock::now();
          delayed_send(this, kTick, tick_atom::value);
          check_done();
          return promise_;
        },
        [this](loss_atom, int64_t mb, uint64_t sum_bits, int64_t count) {
          const double sum = std::bit_cast<double>(sum_bits);
          AP_CHECK(mb >= 0 && mb < end_mbs_ && !have_loss_[static_cast<size_t>(mb)],
                   "loss of microbatch {} unexpected", mb);
          losses_[static_cast<size_t>(mb)] = LossStats{sum, count};
          have_loss_[static_cast<size_t>(mb)] = true;
          ++messages_;
          report_steps();
          check_done();
          await_next();
        },
        [this](credit_atom, int64_t) {
          ++messages_;
          --outstanding_;
          feed();
          report_steps();
          await_next();
        },
        [this](commit_atom, const Commit& c) {
          ++messages_;
          AP_CHECK(c.stage >= 0 && c.stage < st_->stages, "commit of stage {}", c.stage);
          auto& commits = commits_[static_cast<size_t>(c.stage)];
          AP_CHECK(c.update == static_cast<int64_t>(commits.size()),
                   "stage {}: commit of update {} after {}", c.stage, c.update, commits.size());
          commits.push_back(c.seconds);
          times_[static_cast<size_t>(c.stage)] = c.times;
          report_steps();
          await_next();
        },
        [this](done_atom, int stage, const StageTimes& times) {
          ++messages_;
          AP_CHECK(stage >= 0 && stage < st_->stages, "done of stage {}", stage);
          ++done_;
          times_[static_cast<size_t>(stage)] = times;
          report_steps();
          check_done();
        },
        [this](fail_atom, const Failure& f) { fail_with_status(f); },
        [this](rloss_atom, int32_t replica, int64_t k, uint64_t bits) {
          ++messages_;
          AP_CHECK(st_->replica == 0 && replica > 0 && replica < st_->replicas && k >= 0,
                   "loss of replica {}'s step {} unexpected", replica, k);
          ReplicaLosses& losses = replica_losses_[k];
          losses.values.resize(static_cast<size_t>(st_->replicas));
          losses.values[static_cast<size_t>(replica)] = std::bit_cast<double>(bits);
          ++losses.in;
          report_steps();
          check_done();
          await_next();
        },
        [this](rfail_atom, int32_t replica, const std::string& error) {
          // another replica cannot finish the run: neither can this one (its gradients never
          // come); the others were told by that replica's driver
          from_replica_ = true;
          fail(Failure{-1, -1, "", fmt::format("replica {} failed: {}", replica, error)});
        },
        [this](lost_atom, int32_t rank, const std::string& reason) {
          const std::string cause = fmt::format("rank {} was lost ({})", rank, reason);
          note_lost(cause);
          lost_ranks_.insert(rank);
          fail_with_status(Failure{-1, -1, "", cause});
        },
        [this](sumsq_atom, const SumSq& s) {
          ++messages_;
          AP_CHECK(s.stage >= 0 && s.stage < st_->stages, "gradient norm part of stage {}",
                   s.stage);
          auto& parts = sumsq_[s.ordinal];
          parts.resize(static_cast<size_t>(st_->stages));
          parts[static_cast<size_t>(s.stage)] = s.per_layer;
          if (++sumsq_count_[s.ordinal] < st_->stages) return;
          // stage order, then layer order, from 0.0: exactly the serial executor's sum
          double total = 0.0;
          for (const auto& per_layer : parts)
            for (double v : per_layer) total += v;
          float scale = clip_scale(total, st_->grad_clip);
          // a non-finite gradient (also after a non-finite loss): the first layer in stage then
          // layer order fails the run, or the step is dropped on every stage (a NaN scale)
          for (int q = 0; q < st_->stages && !std::isfinite(total); ++q) {
            const auto& per_layer = parts[static_cast<size_t>(q)];
            const int bad = first_nonfinite(per_layer);
            if (bad < 0) continue;
            if (st_->skip_nonfinite) {
              scale = kSkipScale;
              skipped_.insert(s.ordinal);
              break;
            }
            // model and partition from any stage of this process (stage q may run elsewhere)
            const StageWorker* local = nullptr;
            for (const StageWorker* w : st_->workers)
              if (local == nullptr && w != nullptr) local = w;
            const long step = st_->global_offset / st_->group + s.ordinal + 1;
            const int layer = local->partition().begin(q) + bad;
            fail_with_status(Failure{q, -1, "",
                                     nonfinite_gradient(local->model(), step, layer,
                                                        per_layer[static_cast<size_t>(bad)])});
            return;
          }
          for (int r = 0; r < st_->stages; ++r)
            send_to(this, *st_, MailAddress::shard(r), scale_atom::value, s.ordinal, scale);
          sumsq_.erase(s.ordinal);
          sumsq_count_.erase(s.ordinal);
          await_next();
        },
        [this](tick_atom) {
          if (finished_) return;
          // what the stages of this process did, and every message from any stage
          const int64_t p = st_->progress.load(std::memory_order_relaxed) + messages_;
          const auto now = std::chrono::steady_clock::now();
          if (p != last_progress_) {
            last_progress_ = p;
            last_change_ = now;
          } else if (std::chrono::duration<double>(now - last_change_).count() >
                     st_->options.stall_timeout_seconds) {
            fail_with_status(Failure{
                -1, -1, "",
                fmt::format("no action completed for {} s", st_->options.stall_timeout_seconds)});
            return;
          }
          check_stop();
          report_steps();
          delayed_send(this, kTick, tick_atom::value);
        },
    };
  }

 private:
  // While the run goes, a bounded spin on the mailbox before the scheduler thread parks: the
  // stages' next credit, loss or commit often follows within microseconds.
  void await_next() {
    if (!finished_) spin_for_mail(*this, st_->spin_budget());
  }

  // Releases microbatches while credits last: each stage takes microbatch next_mb_ from its
  // process's feed. In a job of several processes every stage gets each microbatch up to
  // `credits` microbatches earlier: a release to another process crosses it (remote mail, or
  // CAF's middleman at 100 µs or more a hop), which the first stage's activation could
  // overtake, and one in the driver's process would wait for the driver's thread to wake for
  // stage 0's credit; either would then be on every microbatch's path. What a stage holds stays
  // bounded (up to 2 × credits microbatches); what it computes does not change: its action list
  // orders its work.
  void feed() {
    check_stop();
    while (!finished_ && next_mb_ < end_mbs_ && outstanding_ < st_->credits) {
      if (!any_remote_)
        for (const caf::actor& a : st_->directory.stages) send(a, mb_atom::value, next_mb_);
      ++next_mb_;
      ++outstanding_;
      peak_ahead_ = std::max(peak_ahead_, outstanding_);
    }
    if (!any_remote_) return;
    const int64_t lead = st_->options.release_ahead_remote ? st_->credits : 0;
    const int64_t ahead = std::min(end_mbs_, next_mb_ + lead);
    for (; !finished_ && next_remote_mb_ < ahead; ++next_remote_mb_)
      for (int r = 0; r < st_->stages; ++r)
        send_to(this, *st_, MailAddress::stage(r), mb_atom::value, next_remote_mb_);
  }

  // A stop asked (ActorCallbacks::stop), seen the first time: the run ends after the last step
  // any microbatch of which was fed (the step in flight): no later microbatch is fed, and every
  // stage ends its list after that step (`cut`). In the sync modes, where every repetition of the
  // schedule is one step ending in a flush, no stage can run an action of a later step: each
  // needs a microbatch of it. In 2bw the run's one schedule ends after that step instead
  // (first_steps): no stage can have started an action of a later step, which needs a
  // microbatch of it or the updates of its backwards; the next run continues it exactly, as
  // after any run of 2bw. pipedream and xpipe end the same way with ActorCallbacks::stop_drains
  // (train.stop = "step": the pipeline drains there, where the uninterrupted training does
  // not), else they run their schedule to its end.
  void check_stop() {
    check_cut();
    if (stop_seen_ || finished_ || st_->callbacks.stop == nullptr ||
        !st_->callbacks.stop->requested())
      return;
    stop_seen_ = true;
    // replicas end at the run's end too: a cut would have to reach every replica's pipeline
    // after the same step, and each replica's driver releases its own microbatches
    if (st_->replicas > 1 || st_->eval) return;
    if (st_->repeats <= 1 && st_->mode != Mode::twobw && !st_->callbacks.stop_drains) return;
    cut_after_fed_step();
  }

  // The migration manager decided to move layers (RunState::cut_request), seen the first time:
  // the run ends after the step in flight as for a stop, in every mode (pipedream and xpipe
  // drain there, as at any move).
  void check_cut() {
    if (cut_seen_ || finished_ || st_->cut_request == nullptr || !st_->cut_request->load()) return;
    cut_seen_ = true;
    if (st_->replicas > 1 || st_->eval || stop_seen_) return;
    cut_after_fed_step();
  }

  // Ends the run after the last step any microbatch of which was released (see check_stop).
  void cut_after_fed_step() {
    const bool sync = st_->repeats > 1;
    const int64_t per = sync ? st_->schedule.total_microbatches() : st_->schedule.microbatches;
    const int64_t total = sync ? st_->repeats : st_->schedule.steps;
    // in a job of several processes stages get microbatches ahead (feed): the furthest counts
    const int64_t released = any_remote_ ? std::max(next_mb_, next_remote_mb_) : next_mb_;
    const int64_t steps = std::max<int64_t>(1, (released + per - 1) / per);
    if (steps >= total) return;
    end_mbs_ = steps * per;
    for (int r = 0; r < st_->stages; ++r)
      send_to(this, *st_, MailAddress::stage(r), cut_atom::value, static_cast<int32_t>(steps));
  }

  // Calls on_step for every complete step, in order: its losses are in and every stage has
  // committed its update (each stage has one OPT_STEP per step). The step's time is the last of
  // those commits. Checked at every message and tick, so a report may come a little after the
  // step; its time is exact.
  void report_steps() {
    const int64_t steps = end_mbs_ / st_->group;
    while (reported_ < steps) {
      const int64_t first = reported_ * st_->group;
      for (int64_t j = first; j < first + st_->group; ++j)
        if (!have_loss_[static_cast<size_t>(j)]) return;
      double completed = 0.0;
      for (const auto& commits : commits_) {
        if (st_->eval) break;  // an evaluation updates nothing
        if (static_cast<int64_t>(commits.size()) <= reported_) return;
        completed = std::max(completed, commits[static_cast<size_t>(reported_)]);
      }
      double loss = 0.0;
      for (int64_t j = first; j < first + st_->group; ++j)
        loss += losses_[static_cast<size_t>(j)].mean();
      loss /= st_->group;
      if (st_->replicas > 1 && !st_->eval) {
        if (st_->replica == 0) {
          // the step's loss is the mean of the replicas' (combine_replica_losses)
          auto it = replica_losses_.find(reported_);
          if (it == replica_losses_.end() || it->second.in < st_->replicas - 1) return;
          std::vector<double>& per = it->second.values;
          per[0] = loss;
          loss = combine_replica_losses(per);
          replica_losses_.erase(it);
        } else if (!st_->directory.drivers.empty()) {
          send(st_->directory.drivers[0], rloss_atom::value, static_cast<int32_t>(st_->replica),
               reported_, std::bit_cast<uint64_t>(loss));
        }
      }
      step_losses_.push_back(loss);
      ++reported_;
      if (st_->callbacks.on_step) {
        StepProgress p;
        p.step = static_cast<int>(reported_);
        p.steps = static_cast<int>(steps);
        p.loss = loss;
        p.tokens = (first + st_->group) * st_->tokens_per_mb;
        p.seconds = completed;
        p.stages = times_;
        p.skipped = skipped_.count(reported_ - 1) > 0;
        st_->callbacks.on_step(p);
      }
    }
  }

  void check_done() {
    if (finished_ || done_ < st_->stages) return;
    if (reported_ * st_->group < end_mbs_) return;
    check_stop();
    RunOutcome out;
    out.ok = true;
    out.stopped = stop_seen_;
    out.cut = cut_seen_;
    out.losses = step_losses_;
    out.peak_ahead = static_cast<int32_t>(peak_ahead_);
    out.stages = times_;
    finish(std::move(out));
  }

  void fail(const Failure& f) {
    if (finished_) return;
    RunOutcome out;
    out.ok = false;
    std::string where = f.stage >= 0 ? fmt::format("stage {}", f.stage) : "driver";
    if (f.microbatch >= 0) where += fmt::format(", microbatch {}", f.microbatch);
    if (!f.action.empty()) where += fmt::format(" ({})", f.action);
    out.error = fmt::format("{}: {}", where, f.cause);
    if (st_->replicas > 1) {
      out.error = fmt::format("replica {}, {}", st_->replica, out.error);
      // the other replicas' shards would wait for this one's gradients
      for (size_t q = 0; q < st_->directory.drivers.size() && !from_replica_; ++q) {
        if (static_cast<int>(q) != st_->replica)
          send(st_->directory.drivers[q], rfail_atom::value, static_cast<int32_t>(st_->replica),
               out.error);
      }
    }
    finish(std::move(out));
  }

  void finish(RunOutcome out) {
    finished_ = true;
    // every other actor stops after its current action (a stage in the middle of a forward
    // finishes it first); the engine joins them before returning
    for (const caf::actor& a : st_->directory.stages) send_exit(a, caf::exit_reason::user_shutdown);
    for (const caf::actor& a : st_->directory.optimizers)
      send_exit(a, caf::exit_reason::user_shutdown);
    promise_.deliver(std::move(out));
    quit();
  }

  // Fails the run with `f` and what every stage is at: asks each (the stages may live in other
  // processes) and waits up to kStatusWait for the answers; a stage that cannot answer (busy in
  // an action, or gone) is named as such.
  void fail_with_status(Failure f) {
    if (finished_ || collecting_) return;
    collecting_ = true;
    pending_failure_ = std::move(f);
    statuses_.assign(static_cast<size_t>(st_->stages), "");
    awaiting_ = st_->stages;
    for (int r = 0; r < st_->stages; ++r) {
      // a stage of a lost rank cannot answer: not waited for
      const int rank = st_->rank_of_stage[static_cast<size_t>(r)];
      if (lost_ranks_.count(rank)) {
        got_status(r, fmt::format("stage {} was on the lost rank {}", r, rank));
        continue;
      }
      request(st_->directory.stages[static_cast<size_t>(r)], kStatusWait, status_atom::value)
          .then([this, r](std::string& s) { got_status(r, std::move(s)); },
                [this, r](caf::error& e) {
                  got_status(r, fmt::format("stage {} does not answer ({})", r, to_string(e)));
                });
    }
  }

  // A lost rank is named in the run's error even when another failure (a channel's, say)
  // reached the driver first.
  void note_lost(const std::string& cause) {
    if (lost_.empty()) lost_ = cause;
  }

  void got_status(int r, std::string s) {
    statuses_[static_cast<size_t>(r)] = std::move(s);
    if (--awaiting_ > 0 || finished_) return;
    Failure f = pending_failure_;
    if (!lost_.empty() && f.cause.find(lost_) == std::string::npos)
      f.cause = lost_ + "; then " + f.cause;
    f.cause += "; stages at:";
    for (const std::string& line : statuses_) f.cause += " " + line + ";";
    f.cause.pop_back();
    fail(f);
  }

  std::shared_ptr<RunState> st_;
  caf::typed_response_promise<RunOutcome> promise_;
  std::set<int> lost_ranks_;  // ranks known lost (their stages are not asked where they stand)
  bool finished_ = false;
  int64_t end_mbs_ = 0;  // microbatches of the run: total_mbs, or fewer after a stop (check_stop)
  bool stop_seen_ = false;
  bool cut_seen_ = false;
  int64_t next_mb_ = 0;
  int64_t next_remote_mb_ = 0;  // the next microbatch released (several processes: any_remote_)
  bool any_remote_ = false;     // a stage runs in another process than the driver
  int64_t outstanding_ = 0;
  int64_t peak_ahead_ = 0;
  int done_ = 0;
  int64_t reported_ = 0;
  std::vector<LossStats> losses_;
  std::vector<bool> have_loss_;
  std::vector<double> step_losses_;
  // replica 0 (pipeline.replicas): the other replicas' losses of each step of the run not yet
  // reported, by step
  struct ReplicaLosses {
    std::vector<double> values;  // index q: replica q's
    int in = 0;                  // how many came
  };
  std::map<int64_t, ReplicaLosses> replica_losses_;
  bool from_replica_ = false;  // the run failed because another replica's did
  std::set<int64_t> skipped_;  // ordinals of the steps dropped (train.nonfinite = "skip")
  std::map<int64_t, std::vector<std::vector<double>>> sumsq_;
  std::map<int64_t, int> sumsq_count_;
  std::vector<std::vector<double>> commits_;  // per stage: when it committed each update
  std::vector<StageTimes> times_;             // per stage: as of its last commit or its end
  int64_t messages_ = 0;                      // from the stages and shards, for the watchdog
  bool collecting_ = false;                   // fail_with_status: waiting for the stages
  std::string lost_;                          // a lost rank, once known
  Failure pending_failure_;
  std::vector<std::string> statuses_;
  int awaiting_ = 0;
  int64_t last_progress_ = -1;
  std::chrono::steady_clock::time_point last_change_;
};

}  // namespace

caf::actor spawn_driver(caf::actor_system& sys, std::shared_ptr<internal::RunState> state) {
  return sys.spawn<DriverActor>(std::move(state));
}

}  // namespace actorpipe
