// Optimizer-shard actor: the update protocol of one stage (tied-gradient exchange, Σg², clip
// scale from the driver or the stage itself, the optimizer update) on its own thread and state.
#include "actors/optimizer_actor.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <map>
#include <span>
#include <utility>

#include "actors/internal/messages.hpp"
#include "actors/internal/remote_mail.hpp"
#include "actors/internal/run_state.hpp"
#include "actors/internal/spin_wait.hpp"
#include "engine/execution/gradient_reducer.hpp"
#include "engine/execution/nonfinite.hpp"
#include "engine/execution/optimizer_shard.hpp"
#include "engine/execution/stage_worker.hpp"
#include "kernels/check.hpp"
#include "kernels/compute_backend.hpp"
#include "kernels/optimizer.hpp"

namespace actorpipe {
namespace {

using namespace internal;
using Clock = std::chrono::steady_clock;

class OptimizerActor : public caf::event_based_actor {
 public:
  OptimizerActor(caf::actor_config& cfg, std::shared_ptr<RunState> st, int stage)
      : caf::event_based_actor(cfg),
        st_(std::move(st)),
        r_(stage),
        shard_(*st_->shards[static_cast<size_t>(stage)]),
        worker_(*st_->workers[static_cast<size_t>(stage)]),
        ctx_(st_->workers[static_cast<size_t>(stage)]->context().threads()),
        sync_(tied_sync(st_->mode)),
        global_clip_(clips_globally(st_->mode)) {
    AP_CHECK(global_clip_ || sync_ == TiedSync::follow_owner,
             "{}: per-stage clipping with tied gradients exchanged", to_string(st_->mode));
    // off the host the update runs on a companion of the stage's backend: its memory, this
    // actor's threads (on a GPU a stream of its own)
    if (!worker_.memory().host_memory()) {
      companion_ = worker_.context().backend().companion(ctx_);
      ctx_.set_backend(companion_.get());
    }
    set_exception_handler([this](caf::scheduled_actor*, std::exception_ptr& ep) -> caf::error {
      const std::string what = exception_text(ep);
      report_failure(what);
      return caf::make_error(caf::sec::runtime_error, what);
    });
    // the other stage of every tied parameter split across stages (the worker's layout is
    // immutable: read here, before the run starts)
    const StageWorker& worker = *st_->workers[static_cast<size_t>(stage)];
    const Model& model = worker.model();
    const Partition& part = worker.partition();
    for (size_t k = 0; k < worker.num_tied(); ++k) {
      const TiedRole role = worker.tied_role(k);
      if (role != TiedRole::owner && role != TiedRole::copy) continue;
      const TiedParam& tp = model.tied()[k];
      Split s;
      s.k = k;
      s.owner = role == TiedRole::owner;
      s.peer = s.owner ? part.stage_of(tp.copy_layer) : part.stage_of(tp.owner_layer);
      s.numel = model.tied_slots(tp).owner.numel;
      const std::vector<int64_t> shape{static_cast<int64_t>(s.numel)};
      // the values handed on are allocated where their channel lends them without a copy
      const auto memory_of = [&](ChannelKind kind) {
        return st_->channels->tied_send_memory(static_cast<int>(k), kind);
      };
      BackendMemory* grads =
          memory_of(s.owner ? ChannelKind::tied_to_copy : ChannelKind::tied_to_owner);
      BackendMemory* weights = s.owner ? memory_of(ChannelKind::tied_weights) : nullptr;
      if (skip()) {
        s.dummy = grads ? Tensor::zeros(shape, DType::f32, *grads) : Tensor::zeros(shape);
        s.weight_dummy = weights ? Tensor::zeros(shape, DType::f32, *weights) : s.dummy;
      }
      s.pool = std::make_shared<TensorPool>(shape, 0, DType::f32, grads);
      s.weight_pool = std::make_shared<TensorPool>(shape, 0, DType::f32, weights);
      splits_.push_back(std::move(s));
    }
  }

  caf::behavior make_behavior() override {
    return {
        [this](update_atom, const UpdateTicket& t) {
          AP_CHECK(!active_, "stage {}: update requested while one is running", r_);
          active_ = true;
          ticket_ = t;
          busy_ns_ = 0;
          phase_ = Phase::tied;
          // step 0.5 (pipeline.replicas): the gradients summed over the replicas, in replica
          // order, before anything reads them (a blocking collective on this shard's thread)
          if (st_->reducer != nullptr && !skip()) {
            Status reduced;
            timed([&] {
              reduced =
                  all_reduce_in(*st_->reducer, ctx_.backend(), r_, job().step(), job().gradients());
            });
            if (!reduced) return report_failure(reduced.error().message);
          }
          begin_update();
          proceed_or_spin();
        },
        [this](tgrad_atom, const TiedAnnouncement& t) {
          auto g = st_->channels->at(t.payload.tag).receive(t.payload);
          if (!g) return report_failure(g.error().message);
          tgrads_[{t.key, t.tied}] = std::move(*g);
          proceed_or_spin();
        },
        [this](scale_atom, int64_t ordinal, float scale) {
          scales_[ordinal] = scale;
          proceed_or_spin();
        },
    };
  }

 private:
  struct Split {
    size_t k = 0;
    bool owner = false;
    int peer = 0;
    size_t numel = 0;
    // skip_compute: the tensor handed instead of a copy of the gradient or weights, made once
    // (the compute-free runs measure messages and hand-offs, not the copies)
    Tensor dummy, weight_dummy;
    // the copies handed on (gradient contributions; new versions), reused once received
    std::shared_ptr<TensorPool> pool, weight_pool;
  };
  enum class Phase { idle, tied, scale };

  Action action() const { return st_->step(r_, static_cast<size_t>(ticket_.index)).action; }
  bool skip() const { return st_->options.skip_compute; }
  UpdateJob& job() { return worker_.open_update(); }

  template <class F>
  void timed(F&& f) {
    const auto t0 = Clock::now();
    f();
    busy_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  }

  // Step 1, sending side: this stage's tied contributions go to the other side's shard
  // (exchange_grads: both ways; follow_owner: copy -> owner only).
  void begin_update() {
    for (const Split& s : splits_) {
      if (sync_ == TiedSync::follow_owner && s.owner) continue;
      Tensor g;
      timed([&] {
        if (skip()) {
          g = s.dummy;
        } else {
          g = s.pool->acquire();
          auto mine = job().tied_grad(s.k);
          ctx_.backend().to_host(g.f32(), mine.data(), mine.size());
        }
      });
      const ChannelKind kind = s.owner ? ChannelKind::tied_to_copy : ChannelKind::tied_to_owner;
      if (!post_tied(s, kind, std::move(g), ordinal_, 0, tgrad_atom::value,
                     MailAddress::shard(static_cast<int>(s.peer))))
        return;
    }
  }

  // proceed(), then a bounded spin on the mailbox before the thread sleeps, when the next
  // message should come soon: an update in progress waits for the peer's tied gradient or the
  // driver's clip scale; a finished one waits for the stage's next OPT_STEP, which is soon only
  // when at most one forward and one backward come before it (pipedream). Otherwise the thread
  // sleeps at once: a spinning shard takes a core from the stages that compute.
  void proceed_or_spin() {
    proceed();
    if (!failed_ && (active_ || next_update_soon_)) spin_for_mail(*this, st_->spin_budget());
  }

  // Advances the current update as far as the messages received allow.
  void proceed() {
    if (!active_ || failed_) return;
    if (phase_ == Phase::tied) {
      // step 1, receiving side: the sum (owner's + copy's) replaces this stage's side
      for (const Split& s : splits_) {
        if (sync_ == TiedSync::follow_owner && !s.owner) continue;
        if (tgrads_.count({ordinal_, static_cast<int>(s.k)}) == 0) return;
      }
      for (const Split& s : splits_) {
        if (sync_ == TiedSync::follow_owner && !s.owner) continue;
        auto it = tgrads_.find({ordinal_, static_cast<int>(s.k)});
        const std::span<const float> other = std::as_const(it->second).span_f32();
        AP_CHECK(other.size() == s.numel, "stage {}: tied gradient of {} floats, expected {}", r_,
                 other.size(), s.numel);
        if (!skip()) {
          timed([&] {
            auto mine = host_view(ctx_.backend(), job().tied_grad(s.k), staged_);
            sum_.resize(s.numel);
            const float* owner = s.owner ? mine.data() : other.data();
            const float* copy = s.owner ? other.data() : mine.data();
            for (size_t i = 0; i < s.numel; ++i) sum_[i] = owner[i] + copy[i];
            job().set_tied_grad(ctx_, s.k, sum_);
          });
        }
        tgrads_.erase(it);
      }
      // step 2
      const size_t layers = static_cast<size_t>(shard_.num_layers());
      std::vector<double> per_layer(layers, 0.0);
      if (!skip()) {
        timed([&] {
          auto sums = job().finish_gradients(ctx_);
          per_layer.assign(sums.begin(), sums.end());
        });
      }
      // step 3
      if (global_clip_) {
        send_to(this, *st_, MailAddress::driver(), sumsq_atom::value,
                SumSq{ordinal_, r_, std::move(per_layer)});
      } else {
        // per-stage clipping (the modes that follow the tied owner): the owner's scale covers
        // the tied parameter, which the copy does not update; a non-finite gradient stops the
        // run here (these modes cannot skip a step: train.nonfinite)
        if (const int bad = first_nonfinite(per_layer); bad >= 0) {
          return report_failure(nonfinite_gradient(worker_.model(), job().step(),
                                                   worker_.first_layer() + bad,
                                                   per_layer[static_cast<size_t>(bad)]));
        }
        double total = 0.0;
        for (double v : per_layer) total += v;
        own_scale_ = clip_scale(total, st_->grad_clip);
      }
      phase_ = Phase::scale;
    }
    if (phase_ == Phase::scale) {
      UpdateScales scales;
      if (global_clip_) {
        auto it = scales_.find(ordinal_);
        if (it == scales_.end()) return;
        scales = {it->second, it->second};
        scales_.erase(it);
      } else {
        scales = {own_scale_, own_scale_};
      }
      // step 4: the new version, written while the stage computes on older ones
      const long version = skip() ? static_cast<long>(ordinal_) + 1 : job().step();
      timed([&] {
        if (st_->options.before_update) st_->options.before_update(r_, version);
        if (skip()) return;
        // the driver's kSkipScale: a step dropped on every stage (train.nonfinite = "skip")
        if (scales.stage == kSkipScale) {
          shard_.skip_update(ctx_, job());
        } else {
          shard_.run_update(ctx_, job(), scales);
        }
      });
      // step 5
      if (sync_ == TiedSync::follow_owner) {
        for (const Split& s : splits_) {
          if (!s.owner) continue;
          Tensor w;
          timed([&] {
            if (skip()) {
              w = s.weight_dummy;
            } else {
              w = s.weight_pool->acquire();
              auto mine = job().tied_weights(s.k);
              ctx_.backend().to_host(w.f32(), mine.data(), mine.size());
            }
          });
          if (!post_tied(s, ChannelKind::tied_weights, std::move(w), version, 0,
                         tweight_atom::value, MailAddress::stage(static_cast<int>(s.peer))))
            return;
        }
      }
      if (st_->options.record_spans) {
        st_->update_spans[static_cast<size_t>(r_)].push_back(
            {r_, action(), ticket_.handed, st_->seconds_since_start()});
      }
      next_update_soon_ = next_update_within(static_cast<size_t>(ticket_.index), 2);
      ++ordinal_;
      active_ = false;
      phase_ = Phase::idle;
      st_->progress.fetch_add(1, std::memory_order_relaxed);
      send(st_->directory.stages[static_cast<size_t>(r_)], published_atom::value, ticket_,
           busy_ns_);
      ticket_ = {};
    }
  }

  // Whether the stage's next OPT_STEP after the one at `pc` comes within `compute` forwards and
  // backwards.
  bool next_update_within(size_t pc, int compute) const {
    // the list once: the stage's actor may shorten it meanwhile (a cut)
    const std::vector<Action>& list = st_->list(r_);
    const size_t n = list.size() * static_cast<size_t>(st_->repeats);
    for (size_t i = pc + 1; i < n; ++i) {
      const ActionKind k = list[i % list.size()].kind;
      if (k == ActionKind::OPT_STEP) return true;
      if (is_compute(k) && --compute < 0) return false;
    }
    return false;
  }

  // Posts `t` on tied parameter s.k's channel of `kind` and announces it to `to` with `atom`
  // (unless the channel delivers the announcement itself).
  // False after reporting a failure.
  template <class Atom>
  bool post_tied(const Split& s, ChannelKind kind, Tensor t, int64_t key, int lookahead, Atom atom,
                 MailAddress to) {
    TensorChannel& ch = st_->channels->tied(static_cast<int>(s.k), kind);
    auto a = post_tied_value(ch, std::move(t), key, lookahead);
    if (!a) {
      report_failure(a.error().message);
      return false;
    }
    if (!ch.announces())  // else the channel delivered it with the payload
      send_to(this, *st_, to, atom, *a);
    return true;
  }

  void report_failure(const std::string& cause) {
    if (failed_) return;
    failed_ = true;
    Failure f;
    f.stage = r_;
    if (active_) f.action = to_string(action());
    f.cause = "optimizer: " + cause;
    send(st_->directory.driver, fail_atom::value, f);
  }

  std::shared_ptr<RunState> st_;
  int r_;
  OptimizerShard& shard_;
  StageWorker& worker_;  // its open update's job is this shard's while the update runs
  Context ctx_;          // the update's compute budget: as many threads as the stage's
  std::unique_ptr<ComputeBackend> companion_;  // off the host: ctx_'s backend
  TiedSync sync_;
  bool global_clip_;
  std::vector<Split> splits_;

  bool active_ = false;
  bool failed_ = false;
  bool next_update_soon_ = false;  // the stage's next OPT_STEP comes within one F and one B
  Phase phase_ = Phase::idle;
  UpdateTicket ticket_;
  int64_t ordinal_ = 0;  // updates done by this shard in the run; aligned across stages
  int64_t busy_ns_ = 0;
  float own_scale_ = 1.0f;
  std::vector<float> sum_;
  std::vector<float> staged_;  // this stage's tied gradient on the host, off the host
  std::map<std::pair<int64_t, int>, Tensor> tgrads_;  // peers' tied contributions received
  std::map<int64_t, float> scales_;
};

}  // namespace

caf::actor spawn_optimizer_actor(caf::actor_system& sys, std::shared_ptr<internal::RunState> state,
                                 int stage) {
  return sys.spawn<OptimizerActor, caf::detached>(std::move(state), stage);
}

}  // namespace actorpipe
