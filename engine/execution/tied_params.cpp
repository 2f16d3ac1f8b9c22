// Tied parameters of one stage: how the two copies of a parameter held by different stages (the
// GPT embedding and its LM head) stay equal, and which owner value each stored version holds.
#include "engine/execution/tied_params.hpp"

#include <algorithm>

#include "kernels/check.hpp"

namespace actorpipe {

Status check_tied_placement(const Model& model, const Partition& partition, Mode mode) {
  if (mode != Mode::xpipe) return {};
  const int last = partition.stages() - 1;
  for (const TiedParam& t : model.tied()) {
    const int owner = partition.stage_of(t.owner_layer), copy = partition.stage_of(t.copy_layer);
    if (owner == copy || copy == last) continue;
    return make_error(
        "xpipe: the tied copy layers.{}.{} is on stage {} of {}, its owner layers.{}.{} on stage "
        "{}; xpipe keeps a copy on another stage than its owner only on the last stage (whose "
        "forwards predict no update ahead): place layer {} on the last stage or with layer {} "
        "(pipeline.partition), or use another mode",
        t.copy_layer, t.copy_slot, copy, partition.stages(), t.owner_layer, t.owner_slot, owner,
        t.copy_layer, t.owner_layer);
  }
  return {};
}

TiedSync tied_sync(Mode mode) {
  return is_synchronous(mode) ? TiedSync::exchange_grads : TiedSync::follow_owner;
}

std::string to_string(TiedVersion v) {
  if (!v.valid()) return "none";
  return v.lookahead == 0 ? std::to_string(v.version)
                          : std::to_string(v.version) + "+" + std::to_string(v.lookahead);
}

TiedParams::TiedParams(const Model& model, const Partition& partition, int stage, Mode mode,
                       int version_capacity)
    : sync_(tied_sync(mode)) {
  const int first = partition.begin(stage);
  for (const TiedParam& tp : model.tied()) {
    TiedLayout t;
    t.owner_stage = partition.stage_of(tp.owner_layer);
    t.copy_stage = partition.stage_of(tp.copy_layer);
    const auto [a, b] = model.tied_slots(tp);
    AP_CHECK(a.decay == b.decay, "tied slots {} / {} differ in weight decay", tp.owner_slot,
             tp.copy_slot);
    t.numel = a.numel;
    const bool owner = t.owner_stage == stage, copy = t.copy_stage == stage;
    t.role = owner && copy ? TiedRole::both
             : owner       ? TiedRole::owner
             : copy        ? TiedRole::copy
                           : TiedRole::none;
    if (owner) {
      t.owner_local = tp.owner_layer - first;
      t.owner_offset = a.offset;
    }
    if (copy) {
      t.copy_local = tp.copy_layer - first;
      t.copy_offset = b.offset;
    }
    layouts_.push_back(t);
    held_.emplace_back();
    held_.back().reserve(static_cast<size_t>(version_capacity) + 2);
    held_.back().emplace_back(0, TiedVersion{0, 0});  // both copies: the same init
  }
  carried_.assign(layouts_.size(), TiedVersion{});
}

const TiedLayout& TiedParams::layout(size_t k) const {
  AP_CHECK(k < layouts_.size(), "tied parameter {} of {}", k, layouts_.size());
  return layouts_[k];
}

TiedVersion TiedParams::held(int version, size_t k) const {
  for (const auto& [v, tv] : held_[k])
    if (v == version) return tv;
  return {};
}

void TiedParams::set_held(int version, size_t k, TiedVersion value) {
  for (auto& [v, tv] : held_[k]) {
    if (v == version) {
      tv = value;
      return;
    }
  }
  held_[k].emplace_back(version, value);
}

void TiedParams::forget_unstored(const WeightStore& store) {
  for (auto& held : held_) {
    std::erase_if(held, [&](const auto& e) { return !store.holds(e.first); });
  }
}

void TiedParams::plan_run(const Schedule& s, int base, int run_microbatches, bool predicts) {
  owner_f_.clear();
  for (size_t k = 0; k < layouts_.size(); ++k) {
    if (!follows(k)) continue;
    owner_f_.assign(static_cast<size_t>(run_microbatches), TiedVersion{});
    for (const Action& a : s.per_stage[static_cast<size_t>(layouts_[k].owner_stage)]) {
      if (a.kind != ActionKind::F || a.microbatch < 0 || a.microbatch >= run_microbatches) continue;
      // the owner predicts only past version 0 (exec_forward): otherwise it uses the version
      const int v = base + a.version;
      owner_f_[static_cast<size_t>(a.microbatch)] = {v, predicts && v > 0 ? a.lookahead : 0};
    }
  }
}

void TiedParams::carry(int latest) {
  for (size_t k = 0; k < layouts_.size(); ++k) carried_[k] = held(latest, k);
}

void TiedParams::commit(const WeightStore& store, long updates) {
  for (size_t k = 0; k < layouts_.size(); ++k) {
    auto& held = held_[k];
    std::erase_if(held, [&](const auto& e) { return !store.holds(e.first); });
    if (follows(k)) {
      set_held(store.latest(), k, carried_[k]);
    } else {
      set_held(store.latest(), k, TiedVersion{static_cast<int>(updates), 0});
    }
  }
}

void TiedParams::rename(int latest, int updates) {
  for (size_t k = 0; k < layouts_.size(); ++k) {
    const TiedVersion tv = held(latest, k);
    held_[k].clear();
    held_[k].emplace_back(updates,
                          tv == TiedVersion{latest, 0} ? TiedVersion{updates, 0} : TiedVersion{});
  }
}

void TiedParams::add_previous(int prev) {
  for (size_t k = 0; k < layouts_.size(); ++k)
    set_held(prev, k, follows(k) ? TiedVersion{} : TiedVersion{prev, 0});
}

}  // namespace actorpipe
