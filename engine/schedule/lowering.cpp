// Lowering: adds the communication actions to a compute-only schedule, each receive right before
// the action that consumes it and each send right after the action that produces it.
#include "engine/schedule/lowering.hpp"

namespace actorpipe {

Expected<Schedule> lower(const Schedule& schedule) {
  for (const auto& list : schedule.per_stage) {
    for (const Action& a : list) {
      if (is_comm(a.kind)) {
        return make_error(
            "cannot lower a schedule that already has communication actions (found {}); "
            "lowering takes a compute-only schedule (F, B, OPT_STEP, FLUSH)",
            to_string(a));
      }
    }
  }
  Schedule out = schedule;
  const int d = schedule.stages;
  for (size_t r = 0; r < out.per_stage.size(); ++r) {
    const int stage = static_cast<int>(r);
    std::vector<Action> list;
    list.reserve(schedule.per_stage[r].size() * 2);
    for (const Action& a : schedule.per_stage[r]) {
      const Action comm{stage, ActionKind::F, a.microbatch, 0, 0};
      auto with = [&](ActionKind kind) {
        Action c = comm;
        c.kind = kind;
        return c;
      };
      if (a.kind == ActionKind::F) {
        if (stage > 0) list.push_back(with(ActionKind::RECV_F));
        list.push_back(a);
        if (stage < d - 1) list.push_back(with(ActionKind::SEND_F));
      } else if (a.kind == ActionKind::B) {
        if (stage < d - 1) list.push_back(with(ActionKind::RECV_B));
        list.push_back(a);
        if (stage > 0) list.push_back(with(ActionKind::SEND_B));
      } else {
        list.push_back(a);
      }
    }
    out.per_stage[r] = std::move(list);
  }
  return out;
}

}  // namespace actorpipe
