// Migration manager: sums the stages' busy time of every step since its last check, and at a
// boundary turns a forced move or the policy's decision into a move of the engine's stages.
#include "actors/migration_manager.hpp"

#include <fmt/format.h>

#include <caf/all.hpp>
#include <optional>

#include "actors/internal/messages.hpp"

namespace actorpipe {
namespace {

using internal::boundary_atom;
using internal::check_atom;
using internal::segment_atom;
using internal::steptimes_atom;

struct ManagerState {
  std::shared_ptr<MigrationManagerSetup> setup;
  std::vector<StageTimes> last;  // the segment's cumulative times at its last step
  std::vector<double> busy;      // per stage, since the last check (or move)
  std::vector<double> idle;
  int steps = 0;  // steps since the last check (or move)
  // a check's decision to move, made at the next segment end
  std::optional<MigrationEvent> pending;
};

const ForcedMove* forced_at(const MigrationManagerSetup& s, long step) {
  for (const ForcedMove& m : s.forced)
    if (m.step == step) return &m;
  return nullptr;
}

// After a move the window starts over: its steps ran on another layout.
void restart_window(ManagerState& st) {
  st.busy.assign(st.busy.size(), 0.0);
  st.idle.assign(st.idle.size(), 0.0);
  st.steps = 0;
}

caf::behavior manager(caf::stateful_actor<ManagerState>* self,
                      std::shared_ptr<MigrationManagerSetup> setup) {
  self->state.setup = std::move(setup);
  return {
      [=](segment_atom) { self->state.last.clear(); },
      [=](steptimes_atom, const std::vector<StageTimes>& now) {
        ManagerState& st = self->state;
        st.busy.resize(now.size(), 0.0);
        st.idle.resize(now.size(), 0.0);
        for (size_t r = 0; r < now.size(); ++r) {
          const StageTimes before = r < st.last.size() ? st.last[r] : StageTimes{};
          st.busy[r] += now[r].busy_seconds - before.busy_seconds;
          st.idle[r] += now[r].idle_seconds - before.idle_seconds;
        }
        st.last = now;
        ++st.steps;
      },
      [=](check_atom, int64_t step, const std::vector<int32_t>& counts32) {
        ManagerState& st = self->state;
        MigrationManagerSetup& s = *st.setup;
        const std::vector<int> counts(counts32.begin(), counts32.end());
        MigrationCheck out;
        MigrationEvent& e = out.event;
        e.step = step;
        e.decided = step;
        e.from = counts;
        // no check on a forced move's step (the window runs on), none while a move waits
        if (!s.policy || step % s.check_every != 0 || st.steps == 0 || forced_at(s, step) ||
            st.pending)
          return s.replies.put(std::move(out));
        auto decision = s.policy->check(step, counts, st.busy, st.steps);
        restart_window(st);
        out.report = true;
        if (!decision) {
          e.error = decision.error().message;
          return s.replies.put(std::move(out));
        }
        e.reason = decision->reason;
        e.imbalance = decision->imbalance;
        e.busy = decision->busy;
        e.speed = decision->speed;
        e.predicted_now = decision->predicted_now;
        e.predicted_new = decision->predicted_new;
        e.to = decision->proposed;
        if (decision->move) {
          st.pending = e;
          out.report = false;
          out.move = true;
        }
        s.replies.put(std::move(out));
      },
      [=](boundary_atom, int64_t step, const std::vector<int32_t>& counts32) {
        ManagerState& st = self->state;
        MigrationManagerSetup& s = *st.setup;
        const std::vector<int> counts(counts32.begin(), counts32.end());
        MigrationEvent e;
        e.step = step;
        e.decided = step;
        e.from = counts;
        if (const ForcedMove* f = forced_at(s, step)) {
          st.pending.reset();  // the layout is forced: a decision made for another is void
          e.forced = true;
          if (f->counts == counts) {
            e.to = counts;
            e.reason = "forced by migration.moves: the stages hold these counts already";
          } else {
            e.reason = "forced by migration.moves";
            move_and_report(s, f->counts, e);
            if (e.moved) restart_window(st);
          }
          return caf::make_message(true, std::move(e));
        }
        if (!st.pending) return caf::make_message(false, std::move(e));
        e = std::move(*st.pending);
        st.pending.reset();
        e.step = step;
        e.from = counts;
        if (e.decided != step)
          e.reason += fmt::format("; decided after step {}, moved after step {}", e.decided, step);
        move_and_report(s, e.to, e);
        if (e.moved) restart_window(st);
        return caf::make_message(true, std::move(e));
      },
  };
}

}  // namespace

void MigrationCheckReplies::put(MigrationCheck verdict) {
  {
    std::lock_guard lock(mu_);
    verdict_ = std::move(verdict);
  }
  cv_.notify_all();
}

Expected<MigrationCheck> MigrationCheckReplies::take(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return verdict_.has_value(); }))
    return make_error("the migration manager gave no verdict within {} ms", timeout.count());
  MigrationCheck out = std::move(*verdict_);
  verdict_.reset();
  return out;
}

void move_and_report(MigrationManagerSetup& s, const std::vector<int>& to, MigrationEvent& e) {
  auto report = s.move(to);
  if (!report) {
    e.error = report.error().message;
    return;
  }
  e.moved = true;
  e.to = to;
  e.layers_moved = report->layers_moved;
  e.bytes_moved = report->bytes_moved;
  e.bytes_sent = report->bytes_sent;
  e.move_seconds = report->seconds;
  if (s.policy) s.policy->moved(report->bytes_copied, report->seconds);
}

long next_migration_boundary(const MigrationManagerSetup& setup, long step, long limit) {
  long next = limit;
  for (const ForcedMove& m : setup.forced) {
    if (m.step > step) {
      next = std::min(next, m.step);
      break;
    }
  }
  return next;
}

caf::actor spawn_migration_manager(caf::actor_system& sys,
                                   std::shared_ptr<MigrationManagerSetup> setup) {
  return sys.spawn(manager, std::move(setup));
}

}  // namespace actorpipe
