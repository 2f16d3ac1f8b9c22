// Stage actor: runs one stage's action list (RECV, F, SEND, B, OPT_STEP hand-off, FLUSH) on its
// own thread, firing each action once its inputs are in; reports losses, credits and failures.
#include "actors/stage_actor.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <exception>
#include <limits>
#include <map>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "actors/internal/messages.hpp"
#include "actors/internal/microbatch_feed.hpp"
#include "actors/internal/remote_mail.hpp"
#include "actors/internal/run_state.hpp"
#include "actors/internal/spin_wait.hpp"
#include "engine/execution/stage_worker.hpp"
#include "kernels/check.hpp"

namespace actorpipe {
namespace {

using namespace internal;
using Clock = std::chrono::steady_clock;

int64_t ns_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

class StageActor : public caf::event_based_actor {
 public:
  StageActor(caf::actor_config& cfg, std::shared_ptr<RunState> st, int stage)
      : caf::event_based_actor(cfg),
        st_(std::move(st)),
        r_(stage),
        worker_(*st_->workers[static_cast<size_t>(stage)]),
        n_(st_->actions(stage)),
        counters_(st_->counters[static_cast<size_t>(stage)]) {
    set_exception_handler([this](caf::scheduled_actor*, std::exception_ptr& ep) -> caf::error {
      const std::string what = exception_text(ep);
      report_failure(what);
      return caf::make_error(caf::sec::runtime_error, what);
    });
    if (st_->options.skip_compute) {
      // as the stage's own outputs and input gradients: where their channel lends them
      const std::vector<int64_t> shape{st_->B, st_->T, worker_.model().options().width};
      const auto edge = [&](bool has, uint32_t tag) {
        BackendMemory* m = has ? st_->channels->send_memory(tag) : nullptr;
        return m != nullptr ? Tensor::zeros(shape, DType::f32, *m) : Tensor::zeros(shape);
      };
      dummy_ = edge(r_ + 1 < st_->stages, channel_tag(r_, Direction::forward));
      dummy_din_ = edge(r_ > 0, channel_tag(r_ - 1, Direction::backward));
    }
    sent_predicted_.resize(worker_.num_tied());
    for (size_t k = 0; k < worker_.num_tied(); ++k) {
      const size_t numel = worker_.model().tied_slots(worker_.model().tied()[k]).owner.numel;
      // allocated where the prediction's channel lends it without a copy
      predicted_pool_.emplace_back(
          std::vector<int64_t>{static_cast<int64_t>(numel)}, 0, DType::f32,
          st_->channels->tied_send_memory(static_cast<int>(k), ChannelKind::tied_prediction));
    }
  }

  caf::behavior make_behavior() override {
    last_end_ = Clock::now();
    if (n_ > 0) cur_ = st_->step(r_, 0);
    return {
        [this](mb_atom, int64_t mb) {
          auto p = st_->feed->take(mb);
          if (!p) return report_failure(p.error().message);
          mbs_[mb] = std::move(*p);
          advance_or_spin();
        },
        [this](ann_atom, const Announcement& a) {
          if (r_ > 0 && a.tag == channel_tag(r_ - 1, Direction::forward)) {
            act_ann_[a.microbatch] = a;
          } else if (r_ + 1 < st_->stages && a.tag == channel_tag(r_, Direction::backward)) {
            grad_ann_[a.microbatch] = a;
          } else {
            return report_failure(
                fmt::format("an announcement for another stage arrived: {}", to_string(a)));
          }
          advance_or_spin();
        },
        [this](tweight_atom, const TiedAnnouncement& t) {
          auto w = st_->channels->at(t.payload.tag).receive(t.payload);
          if (!w) return report_failure(w.error().message);
          if (!skip())
            tied_w_[{t.tied, TiedVersion{static_cast<int>(t.key), t.lookahead}}] = std::move(*w);
          advance_or_spin();
        },
        [this](cut_atom, int32_t steps) {
          // the run ends after `steps` steps (the driver's cut: this stage has not started an
          // action of a later step). Sync modes: after that many repetitions of the schedule;
          // the asynchronous modes' one schedule: its first `steps` steps (first_steps), which
          // agree with it on every action this stage has run
          if (st_->repeats > 1) {
            const size_t n = st_->list(r_).size() * static_cast<size_t>(std::max(steps, 0));
            if (n < n_) {
              if (pc_ > n)
                return report_failure(fmt::format(
                    "asked to end after step {} at action {} of {}, past it", steps, pc_, n));
              n_ = n;
            }
          } else if (steps < st_->schedule.steps) {
            if (Status ok = shorten(steps); !ok) return report_failure(ok.error().message);
          }
          advance_or_spin();
        },
        [this](status_atom) -> std::string { return status(); },
        [this](published_atom, const UpdateTicket&, int64_t busy_ns) {
          AP_CHECK(update_pending_, "stage {}: published without an update", r_);
          if (!skip()) worker_.commit_update(worker_.open_update());
          update_pending_ = false;
          const double committed = st_->seconds_since_start();
          if (blocked_) {
            // the wait for the new version counts as busy up to the shard's own compute
            blocked_ = false;
            const int64_t credit = std::min(busy_ns, ns_between(blocked_since_, Clock::now()));
            if (pc_ < n_) {
              credit_ns_ += credit;  // taken from the idle gap before the next action
            } else {
              counters_.busy_ns.fetch_add(credit, std::memory_order_relaxed);
            }
          }
          // the step this update ends is complete at this stage (the driver reports a step once
          // every stage's update of it is in)
          send_to(this, *st_, MailAddress::driver(), commit_atom::value,
                  Commit{r_, updates_++, committed, stage_times(*st_, r_)});
          advance_or_spin();
        },
    };
  }

 private:
  const StageStep* current() const { return pc_ < n_ ? &cur_ : nullptr; }

  // advance(), then, when the stage waits for a message (an input, its shard's new version),
  // a bounded spin on the mailbox before the thread sleeps.
  void advance_or_spin() {
    advance();
    if (!failed_ && (pc_ < n_ || update_pending_))
      spin_for_mail(*this, st_->stage_spin_budget(), st_->channels->poller());
  }

  // What the stage is at: "stage 2 waits at 2RECV_F2 (action 5 of 20, microbatch 2)", "... for
  // its optimizer shard's update", "stage 1 done".
  std::string status() const {
    if (failed_) return fmt::format("stage {} failed", r_);
    if (pc_ >= n_) {
      return update_pending_ ? fmt::format("stage {} waits for its last update", r_)
                             : fmt::format("stage {} done", r_);
    }
    std::string s = fmt::format("stage {} waits at {} (action {} of {}, microbatch {})", r_,
                                to_string(cur_.action), pc_, n_, st_->global_mb(cur_.mb));
    if (blocked_) s += " for its optimizer shard's update";
    return s;
  }

  // Runs every action whose inputs are in, in order.
  void advance() {
    while (!failed_ && pc_ < n_) {
      const StageStep& s = cur_;
      if (s.starts && !repeat_started_) {
        if (update_pending_) return block();  // a run starts from committed weights
        // every repetition of the schedule is a run of the worker (sync modes: one per step); an
        // evaluation runs none
        if (!skip() && !st_->eval) {
          const int64_t first =
              st_->global_mb(static_cast<int64_t>(s.repeat) * st_->schedule.total_microbatches());
          const Schedule* cut =
              st_->shortened[static_cast<size_t>(r_)].load(std::memory_order_acquire);
          Status ok = worker_.start_run(cut != nullptr ? *cut : st_->schedule, first);
          if (!ok) return report_failure(ok.error().message);
        }
        repeat_started_ = true;
      }
      if (update_pending_ && waits_for_update(s.action)) return block();
      if (!ready(s)) return;
      start_ = Clock::now();
      const int64_t gap = ns_between(last_end_, start_);
      const int64_t credit = std::min(credit_ns_, gap);
      credit_ns_ = 0;
      counters_.busy_ns.fetch_add(credit, std::memory_order_relaxed);
      counters_.idle_ns.fetch_add(gap - credit, std::memory_order_relaxed);
      execute(s);
      if (failed_) return;
      finish_action();
    }
    if (pc_ == n_ && update_pending_) return block();  // the run ends with committed weights
    if (pc_ == n_ && !done_sent_ && !failed_) {
      if (!skip() && !st_->eval && !install_owner_tied()) return;
      done_sent_ = true;
      send_to(this, *st_, MailAddress::driver(), done_atom::value, r_, stage_times(*st_, r_));
    }
  }

  // An asynchronous run cut short after `steps` steps: the stage takes the shorter list where it
  // stands (every action it has run is in it, at the same place) and its worker the shorter run.
  Status shorten(int steps) {
    auto cut = first_steps(st_->schedule, steps);
    if (!cut) return cut.error();
    const auto& before = st_->list(r_);
    const auto& after = cut->per_stage[static_cast<size_t>(r_)];
    if (pc_ > after.size() ||
        !std::equal(after.begin(), after.begin() + static_cast<long>(pc_), before.begin())) {
      return make_error("stage {}: asked to end after step {} at action {} of {}, past it", r_,
                        steps, pc_, n_);
    }
    if (repeat_started_ && !skip() && !st_->eval) {
      if (Status ok = worker_.shorten_run(*cut); !ok) return ok;
    }
    st_->shorten(r_, std::move(*cut));
    n_ = st_->actions(r_);
    if (pc_ < n_) cur_ = st_->step(r_, pc_);
    return {};
  }

  // The stage's next action (or its run's start or end) waits for its open update's commit.
  void block() {
    if (blocked_) return;
    blocked_ = true;
    blocked_since_ = Clock::now();
  }

  // Whether `a` must wait for the update in progress: an action that needs the version being
  // written (the worker knows which), or the next OPT_STEP (one update at a time).
  bool waits_for_update(const Action& a) const {
    return skip() ? a.kind == ActionKind::OPT_STEP : worker_.waits_for_update(a);
  }

  // Book-keeping after an action: time, span, counters, next pc.
  void finish_action() {
    auto end = Clock::now();
    if (r_ == st_->options.slow_stage && st_->options.slowdown > 1.0 &&
        (cur_.action.kind == ActionKind::F || cur_.action.kind == ActionKind::B)) {
      // the benchmark's slower stage: the action takes `slowdown` times its time
      const auto until = start_ +
                         std::chrono::duration_cast<Clock::duration>(
                             (end - start_) * (st_->options.slowdown - 1.0)) +
                         (end - start_);
      while (Clock::now() < until) {
      }
      end = Clock::now();
    }
    counters_.busy_ns.fetch_add(ns_between(start_, end), std::memory_order_relaxed);
    if (st_->options.record_spans) {
      const auto t0 = std::chrono::duration<double>(start_ - st_->start).count();
      const auto t1 = std::chrono::duration<double>(end - st_->start).count();
      st_->spans[static_cast<size_t>(r_)].push_back({r_, cur_.action, t0, t1});
    }
    last_end_ = end;
    ++pc_;
    if (pc_ < n_) {
      cur_ = st_->step(r_, pc_);
      if (cur_.starts) repeat_started_ = false;
    }
    counters_.actions.fetch_add(1, std::memory_order_relaxed);
    counters_.pc.store(static_cast<int>(pc_), std::memory_order_relaxed);
    st_->progress.fetch_add(1, std::memory_order_relaxed);
  }

  bool skip() const { return st_->options.skip_compute; }

  bool ready(const StageStep& s) {
    switch (s.action.kind) {
      case ActionKind::RECV_F:
        return act_ann_.count(s.mb) > 0;
      case ActionKind::RECV_B:
        return grad_ann_.count(s.mb) > 0;
      case ActionKind::F: {
        if (mbs_.count(s.mb) == 0) return false;
        if (skip() || st_->eval) return true;
        for (size_t k = 0; k < worker_.num_tied(); ++k) {
          const TiedVersion need = worker_.tied_version_needed(s.action, k);
          if (need.valid() && tied_w_.count({static_cast<int>(k), need}) == 0) return false;
        }
        return true;
      }
      case ActionKind::B:
        return mbs_.count(s.mb) > 0;
      case ActionKind::FLUSH:  // local: see execute()
      case ActionKind::SEND_F:
      case ActionKind::SEND_B:
      case ActionKind::OPT_STEP:
        return true;
    }
    return false;
  }

  bool injected(const StageStep& s, FaultInjection::Kind kind) const {
    if (st_->eval) return false;  // the faults are for training microbatches
    const FaultInjection& f = st_->options.fault;
    return f.kind == kind && f.stage == r_ && f.microbatch == st_->global_mb(s.mb);
  }

  void execute(const StageStep& s) {
    const Action& a = s.action;
    ChannelSet& ch = *st_->channels;
    switch (a.kind) {
      case ActionKind::RECV_F: {
        auto it = act_ann_.find(s.mb);
        auto t = ch.forward(r_ - 1).receive(it->second);
        if (!t) return report_failure(t.error().message);
        inputs_[s.mb] = std::move(*t);
        act_ann_.erase(it);
        break;
      }
      case ActionKind::RECV_B: {
        auto it = grad_ann_.find(s.mb);
        auto t = ch.backward(r_).receive(it->second);
        if (!t) return report_failure(t.error().message);
        douts_[s.mb] = std::move(*t);
        grad_ann_.erase(it);
        break;
      }
      case ActionKind::F: {
        if (injected(s, FaultInjection::Kind::throw_in_forward))
          throw std::runtime_error("injected fault in forward");
        const Microbatch& mb = *mbs_.at(s.mb);
        Tensor in;
        if (auto it = inputs_.find(s.mb); it != inputs_.end()) {
          in = std::move(it->second);
          inputs_.erase(it);
        }
        ForwardOutput out;
        if (skip()) {
          if (r_ + 1 < st_->stages) out.out = dummy_;
          out.loss = LossStats{0.0, 1};
        } else if (st_->eval) {
          out = worker_.evaluate(mb, in);
        } else {
          for (size_t k = 0; k < worker_.num_tied(); ++k) {
            const TiedVersion need = worker_.tied_version_needed(a, k);
            if (!need.valid()) continue;
            const int key = static_cast<int>(k);
            auto it = tied_w_.find({key, need});
            worker_.install_tied_weights(a, k, need, std::as_const(it->second).span_f32());
            // later forwards need this value or newer ones (values grow with microbatches)
            tied_w_.erase(tied_w_.lower_bound({key, TiedVersion{0, 0}}), it);
          }
          out = worker_.exec_forward(a, mb, in);
          publish_predicted_tied();
        }
        if (injected(s, FaultInjection::Kind::poison_output)) {
          if (out.out.defined()) {
            // a host tensor in its place: the output may be in a device's memory
            Tensor poisoned = Tensor::zeros(out.out.shape());
            for (float& x : poisoned.span_f32()) x = std::numeric_limits<float>::quiet_NaN();
            out.out = std::move(poisoned);
          } else {
            out.loss.sum = std::numeric_limits<double>::quiet_NaN();
          }
        }
        if (r_ + 1 == st_->stages) {
          // train.nonfinite = "skip": the driver drops the step at its update instead
          if (!std::isfinite(out.loss.sum) && !st_->skip_nonfinite) {
            return report_failure(
                fmt::format("non-finite loss {} over {} targets", out.loss.sum, out.loss.count));
          }
          send_to(this, *st_, MailAddress::driver(), loss_atom::value, s.mb,
                  std::bit_cast<uint64_t>(out.loss.sum), out.loss.count);
        } else {
          outputs_[s.mb] = std::move(out.out);
        }
        if (st_->eval) {  // no B follows: the microbatch is done here
          mbs_.erase(s.mb);
          if (r_ == 0) send_to(this, *st_, MailAddress::driver(), credit_atom::value, s.mb);
        }
        break;
      }
      case ActionKind::SEND_F: {
        auto it = outputs_.find(s.mb);
        AP_CHECK(it != outputs_.end(), "stage {}: {} without its F", r_, to_string(a));
        auto ann = ch.forward(r_).post(std::move(it->second), s.mb, a.version);
        outputs_.erase(it);
        if (!ann) return report_failure(ann.error().message);
        if (injected(s, FaultInjection::Kind::drop_activation)) break;
        if (!ch.forward(r_).announces())  // else the channel delivered it with the payload
          send_to(this, *st_, MailAddress::stage(r_ + 1), ann_atom::value, *ann);
        break;
      }
      case ActionKind::B: {
        if (injected(s, FaultInjection::Kind::throw_in_backward))
          throw std::runtime_error("injected fault in backward");
        const Microbatch& mb = *mbs_.at(s.mb);
        Tensor dout;
        if (auto it = douts_.find(s.mb); it != douts_.end()) {
          dout = std::move(it->second);
          douts_.erase(it);
        }
        if (injected(s, FaultInjection::Kind::poison_gradient) && dout.defined()) {
          // a copy: the received tensor may be a buffer the channel reuses
          Tensor poisoned = Tensor::zeros(dout.shape());
          for (float& x : poisoned.span_f32()) x = std::numeric_limits<float>::quiet_NaN();
          dout = std::move(poisoned);
        }
        // split_backward: when this B's SEND_B comes next, the gradient goes out as soon as
        // it is computed and the weight gradients follow (that SEND_B then finds it sent)
        const StageStep next = pc_ + 1 < n_ ? st_->step(r_, pc_ + 1) : StageStep{};
        const bool split = !skip() && r_ > 0 && st_->split_backward &&
                           next.action.kind == ActionKind::SEND_B && next.mb == s.mb;
        if (skip()) {
          if (r_ > 0) dins_[s.mb] = dummy_din_;
        } else if (split) {
          dins_[s.mb] = worker_.exec_backward_input(a, mb, dout);
          const bool sent = send_gradient(next);
          worker_.exec_backward_weights();
          if (!sent) return;
          sent_early_.insert(s.mb);
        } else {
          Tensor din = worker_.exec_backward(a, mb, dout);
          if (r_ > 0) dins_[s.mb] = std::move(din);
        }
        mbs_.erase(s.mb);
        if (r_ == 0) send_to(this, *st_, MailAddress::driver(), credit_atom::value, s.mb);
        break;
      }
      case ActionKind::SEND_B: {
        if (sent_early_.erase(s.mb) > 0) break;
        send_gradient(s);
        break;
      }
      case ActionKind::OPT_STEP: {
        // the shard applies the update while this stage runs on; it commits on `published`
        UpdateTicket t;
        t.index = static_cast<int64_t>(pc_);
        t.handed = st_->seconds_since_start();
        if (!skip()) worker_.begin_update(a);
        update_pending_ = true;
        send(st_->directory.optimizers[static_cast<size_t>(r_)], update_atom::value, t);
        // let the shard start now: on a core it shares with this stage (a rank bound to one
        // CPU) it would otherwise wait for this stage's next wait, and the next OPT_STEP (in
        // pipedream, one forward and one backward away) waits for it (docs/benchmarks.md, "CPU
        // binding": 51-54 µs per microbatch instead of 58-63 across two processes)
        std::this_thread::yield();
        break;
      }
      case ActionKind::FLUSH:
        // The schedule's end-of-step barrier needs no message here: nothing of step t+1 runs at
        // any stage before the work of step t it depends on is done everywhere (a stage's next
        // step waits for its own update's commit and for microbatches of that step; its update
        // waits for its last backward, which waits for every later stage's, and with a global
        // clip for every stage's gradient norm). Waiting for the driver's word as well would add
        // two control-plane hops per step across processes and change no value: the serial
        // executor, which waits, computes the same bits.
        if (!skip()) worker_.exec_flush(a);
        break;
    }
  }

  // SEND_B `s`: posts the stashed input gradient of s.mb on the channel and announces it to the
  // previous stage. False after reporting a failure.
  bool send_gradient(const StageStep& s) {
    auto it = dins_.find(s.mb);
    AP_CHECK(it != dins_.end(), "stage {}: {} without its B", r_, to_string(s.action));
    TensorChannel& channel = st_->channels->backward(r_ - 1);
    auto ann = channel.post(std::move(it->second), s.mb, s.action.version);
    dins_.erase(it);
    if (!ann) {
      report_failure(ann.error().message);
      return false;
    }
    if (!channel.announces())  // else the channel delivered it with the payload
      send_to(this, *st_, MailAddress::stage(r_ - 1), ann_atom::value, *ann);
    return true;
  }

  // follow_owner copy at the end of its run: installs the owner's newest version of each tied
  // parameter (and in 2bw the one before, which a continued run computes with), so both copies
  // are equal at rest, as the serial executor leaves them. False while the owner's newest
  // version has not arrived yet (its shard publishes it after the last update).
  bool install_owner_tied() {
    if (tied_sync(st_->mode) != TiedSync::follow_owner) return true;
    const int newest = static_cast<int>(worker_.updates());
    for (size_t k = 0; k < worker_.num_tied(); ++k) {
      if (worker_.tied_role(k) != TiedRole::copy) continue;
      if (tied_w_.count({static_cast<int>(k), TiedVersion{newest, 0}}) == 0) return false;
    }
    for (size_t k = 0; k < worker_.num_tied(); ++k) {
      if (worker_.tied_role(k) != TiedRole::copy) continue;
      const int key = static_cast<int>(k);
      worker_.install_tied_weights(
          k, newest, std::as_const(tied_w_.at({key, TiedVersion{newest, 0}})).span_f32());
      if (worker_.holds_previous()) {
        auto it = tied_w_.find({key, TiedVersion{newest - 1, 0}});
        // a run of one update: the previous version is the one installed at the end of the run
        // before, and still holds the owner's value
        if (it == tied_w_.end() && worker_.tied_held(newest - 1, k) == TiedVersion{newest - 1, 0})
          continue;
        if (it == tied_w_.end()) {
          report_failure(fmt::format(
              "the owner's version {} of tied parameter {} is gone at the end of the run",
              newest - 1, k));
          return false;
        }
        worker_.install_tied_weights(k, newest - 1, std::as_const(it->second).span_f32());
      }
    }
    tied_w_.clear();
    return true;
  }

  // xpipe owner: a forward that predicted a tied parameter hands that value to the copy's stage,
  // which computes the same microbatch with it (once per value: microbatches may share one).
  void publish_predicted_tied() {
    for (size_t k = 0; k < worker_.num_tied(); ++k) {
      const StageWorker::PredictedTied p = worker_.predicted_tied(k);
      if (!p.version.valid()) continue;
      if (sent_predicted_[k] == p.version) continue;
      sent_predicted_[k] = p.version;
      Tensor w = predicted_pool_[k].acquire();
      worker_.memory().to_host(w.f32(), p.weights.data(), p.weights.size());
      TensorChannel& ch = st_->channels->tied(static_cast<int>(k), ChannelKind::tied_prediction);
      auto t = post_tied_value(ch, std::move(w), p.version.version, p.version.lookahead);
      if (!t) return report_failure(t.error().message);
      if (!ch.announces())  // else the channel delivered it with the payload
        send_to(this, *st_, MailAddress::stage(ch.ends().to), tweight_atom::value, *t);
    }
  }

  void report_failure(const std::string& cause) {
    if (failed_) return;
    failed_ = true;
    Failure f;
    f.stage = r_;
    if (const StageStep* s = current()) {
      f.microbatch = st_->global_mb(s->mb);
      f.action = to_string(s->action);
    }
    f.cause = cause;
    send(st_->directory.driver, fail_atom::value, f);
  }

  std::shared_ptr<RunState> st_;
  int r_;
  StageWorker& worker_;
  size_t n_;       // actions in the run (fewer after a `cut`)
  StageStep cur_;  // the action at pc_
  StageCounters& counters_;
  Tensor dummy_;      // skip_compute: every output sent forward
  Tensor dummy_din_;  // skip_compute: every input gradient sent back

  size_t pc_ = 0;
  bool repeat_started_ = false;
  bool update_pending_ = false;  // handed to the shard, not committed yet
  bool blocked_ = false;         // the next action waits for that commit, since blocked_since_
  Clock::time_point blocked_since_;
  int64_t credit_ns_ = 0;  // a wait for the shard's compute, to count as busy
  bool failed_ = false;
  bool done_sent_ = false;
  Clock::time_point start_, last_end_;

  std::unordered_map<int64_t, MicrobatchPtr> mbs_;
  std::unordered_map<int64_t, Announcement> act_ann_, grad_ann_;
  std::unordered_map<int64_t, Tensor> inputs_, outputs_, douts_, dins_;
  std::unordered_set<int64_t> sent_early_;  // B sent its gradient itself (split_backward)
  std::map<std::pair<int, TiedVersion>, Tensor> tied_w_;  // tied values received, by version
  std::vector<TiedVersion> sent_predicted_;  // per tied k: the last prediction handed on
  std::vector<TensorPool> predicted_pool_;   // per tied k: predictions handed on (xpipe owner)
  int64_t updates_ = 0;                      // updates committed in this run
};

}  // namespace

caf::actor spawn_stage_actor(caf::actor_system& sys, std::shared_ptr<internal::RunState> state,
                             int stage) {
  return sys.spawn<StageActor, caf::detached>(std::move(state), stage);
}

}  // namespace actorpipe
