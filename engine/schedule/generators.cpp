// Schedule generators for the five modes. All share one 1F1B (or all-F-then-all-B) action order
// per stage; the modes differ in where OPT_STEP lands and which version each F and B uses.
#include "engine/schedule/generators.hpp"

#include <algorithm>

namespace actorpipe {
namespace {

Status check_positive(const char* what, int value) {
  if (value < 1) return make_error("{} = {} is not allowed: it must be >= 1", what, value);
  return {};
}

// Stage r's compute order over n microbatches: gpipe (all F, all B) or 1F1B with `warmup`
// forwards first. OPT_STEP is inserted after the B whose microbatch + 1 is a multiple of
// `opt_every`. Versions are left at 0.
std::vector<Action> compute_order(int r, int n, bool all_forward_first, int warmup, int opt_every) {
  std::vector<Action> out;
  int opt_steps = 0;
  auto f = [&](int j) { out.push_back({r, ActionKind::F, j, 0, 0}); };
  auto b = [&](int j) {
    out.push_back({r, ActionKind::B, j, 0, 0});
    if ((j + 1) % opt_every == 0) out.push_back({r, ActionKind::OPT_STEP, -1, ++opt_steps, 0});
  };
  if (all_forward_first) {
    for (int j = 0; j < n; ++j) f(j);
    for (int j = 0; j < n; ++j) b(j);
  } else {
    const int w = std::min(warmup, n);
    for (int j = 0; j < w; ++j) f(j);
    for (int j = 0; j + w < n; ++j) {
      f(j + w);
      b(j);
    }
    for (int j = n - w; j < n; ++j) b(j);
  }
  out.push_back({r, ActionKind::FLUSH, -1, 0, 0});
  return out;
}

Schedule make(Mode mode, int d, int m, int steps, bool all_forward_first) {
  Schedule s{mode, d, m, steps, {}};
  for (int r = 0; r < d; ++r) {
    s.per_stage.push_back(compute_order(r, m * steps, all_forward_first, d - r - 1, m));
  }
  return s;
}

// Sets the version of every F and B to the number of OPT_STEPs executed at its stage before
// the F (weight stashing: the B reuses its F's version).
void stash_versions(Schedule& s) {
  for (auto& list : s.per_stage) {
    std::vector<int> version(s.total_microbatches(), 0);
    int current = 0;
    for (Action& a : list) {
      if (a.kind == ActionKind::OPT_STEP) current = a.version;
      if (a.kind == ActionKind::F) version[a.microbatch] = a.version = current;
      if (a.kind == ActionKind::B) a.version = version[a.microbatch];
    }
  }
}

}  // namespace

Expected<Schedule> make_gpipe(int stages, int microbatches) {
  if (auto st = check_positive("stages", stages); !st) return st.error();
  if (auto st = check_positive("microbatches", microbatches); !st) return st.error();
  return make(Mode::gpipe, stages, microbatches, 1, /*all_forward_first=*/true);
}

Expected<Schedule> make_1f1b(int stages, int microbatches) {
  if (auto st = check_positive("stages", stages); !st) return st.error();
  if (auto st = check_positive("microbatches", microbatches); !st) return st.error();
  return make(Mode::onef1b, stages, microbatches, 1, false);
}

Expected<Schedule> make_2bw(int stages, int microbatches, int steps, bool continued) {
  if (auto st = check_positive("stages", stages); !st) return st.error();
  if (auto st = check_positive("microbatches", microbatches); !st) return st.error();
  if (auto st = check_positive("steps", steps); !st) return st.error();
  if (microbatches < stages) {
    return make_error(
        "2bw needs microbatches >= stages: m = {} is less than d = {} (the forwards of step "
        "t+1 would run before the update after step t-1 that produces their version)",
        microbatches, stages);
  }
  Schedule s = make(Mode::twobw, stages, microbatches, steps, false);
  for (auto& list : s.per_stage) {
    for (Action& a : list) {
      if (!is_compute(a.kind)) continue;
      a.version = a.microbatch / microbatches - 1;
      if (!continued) a.version = std::max(a.version, 0);
    }
  }
  s.continued = continued;
  return s;
}

Expected<Schedule> make_pipedream(int stages, int steps) {
  if (auto st = check_positive("stages", stages); !st) return st.error();
  if (auto st = check_positive("steps", steps); !st) return st.error();
  Schedule s = make(Mode::pipedream, stages, 1, steps, false);
  stash_versions(s);
  return s;
}

Expected<Schedule> make_xpipe(int stages, int microbatches, int steps) {
  if (auto st = check_positive("stages", stages); !st) return st.error();
  if (auto st = check_positive("microbatches", microbatches); !st) return st.error();
  if (auto st = check_positive("steps", steps); !st) return st.error();
  Schedule s = make(Mode::xpipe, stages, microbatches, steps, false);
  for (auto& list : s.per_stage) {
    std::vector<Action*> forward(s.total_microbatches(), nullptr);
    int current = 0;
    for (Action& a : list) {
      if (a.kind == ActionKind::OPT_STEP) current = a.version;
      if (a.kind == ActionKind::F) {
        a.version = current;
        forward[a.microbatch] = &a;
      }
      if (a.kind == ActionKind::B) {
        a.version = current;
        forward[a.microbatch]->lookahead = current - forward[a.microbatch]->version;
      }
    }
  }
  return s;
}

Expected<Schedule> make_schedule(Mode mode, int stages, int microbatches, int steps) {
  if ((mode == Mode::gpipe || mode == Mode::onef1b) && steps != 1) {
    return make_error("steps = {} is not allowed for {}: a {} schedule covers exactly one step",
                      steps, to_string(mode), to_string(mode));
  }
  switch (mode) {
    case Mode::gpipe:
      return make_gpipe(stages, microbatches);
    case Mode::onef1b:
      return make_1f1b(stages, microbatches);
    case Mode::twobw:
      return make_2bw(stages, microbatches, steps);
    case Mode::pipedream: {
      if (auto st = check_positive("microbatches", microbatches); !st) return st.error();
      if (auto st = check_positive("steps", steps); !st) return st.error();
      return make_pipedream(stages, microbatches * steps);
    }
    case Mode::xpipe:
      return make_xpipe(stages, microbatches, steps);
  }
  return make_error("mode {} is unknown", static_cast<int>(mode));
}

Expected<Schedule> make_forward_only(int stages, int microbatches) {
  if (stages < 1 || microbatches < 1) {
    return make_error("forward-only pass: stages = {}, microbatches = {}: expected >= 1", stages,
                      microbatches);
  }
  Schedule s;
  s.mode = Mode::gpipe;
  s.stages = stages;
  s.microbatches = microbatches;
  s.steps = 1;
  s.per_stage.resize(static_cast<size_t>(stages));
  for (int r = 0; r < stages; ++r) {
    auto& list = s.per_stage[static_cast<size_t>(r)];
    for (int j = 0; j < microbatches; ++j) {
      if (r > 0) list.push_back(Action{r, ActionKind::RECV_F, j, 0, 0});
      list.push_back(Action{r, ActionKind::F, j, 0, 0});
      if (r + 1 < stages) list.push_back(Action{r, ActionKind::SEND_F, j, 0, 0});
    }
  }
  return s;
}

}  // namespace actorpipe
