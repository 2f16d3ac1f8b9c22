// Tied parameters of one stage: how the two copies of a parameter held by different stages (the
// GPT embedding and its LM head) stay equal, and which owner value each stored version holds.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/execution/update_job.hpp"
#include "engine/execution/weight_store.hpp"
#include "engine/mode.hpp"
#include "engine/model/model.hpp"
#include "engine/model/partition.hpp"
#include "engine/schedule/schedule.hpp"

namespace actorpipe {

/// How the two copies of a tied parameter held by different stages stay equal (docs/modes.md,
/// "Tied embeddings").
///  exchange_grads  (gpipe, 1f1b) both stages exchange their gradient contributions of an
///                  update, both set the sum (owner's + copy's, in that order) and apply the same
///                  update with the same optimizer state and clip scale.
///  follow_owner    (2bw, pipedream, xpipe) the copy's stage sends its contribution to the
///                  owner's stage, which alone updates the parameter and publishes each new
///                  version; the copy's stage installs, before a forward, the value the owner's
///                  stage computed the same microbatch's forward with (in xpipe possibly a
///                  prediction), and never updates the copy itself.
enum class TiedSync : uint8_t { exchange_grads, follow_owner };
TiedSync tied_sync(Mode mode);

/// Whether `mode` can keep the model's ties over `partition`: in xpipe a copy on another stage
/// than its owner must sit on the last stage, whose forwards look no update ahead (the owner's
/// stage predicts the tied value only for the copy's lookahead 0). Errors name the tie, the
/// stage and the ways out.
Status check_tied_placement(const Model& model, const Partition& partition, Mode mode);

/// A value of a tied parameter as a follow_owner copy computes with it: the owner stage's
/// version, and in xpipe the updates the owner's forward predicted ahead of it (0: the version as
/// it is; a forward at version 0 has nothing to predict from and uses lookahead 0). Microbatches
/// need non-decreasing values in this order.
struct TiedVersion {
  int version = -1;  ///< -1: none
  int lookahead = 0;
  bool valid() const { return version >= 0; }
  friend auto operator<=>(const TiedVersion&, const TiedVersion&) = default;
};
/// "3", or "3+1" for a prediction one update ahead of version 3; "none".
std::string to_string(TiedVersion v);

/// The model's tied parameters as one stage holds them: where (TiedLayout per parameter k, in
/// Model::tied() order) and, per stored weight version, which value of the owner's the stage's
/// copy holds. Only a follow_owner copy ever holds another value than the version's own; the
/// StageWorker asks it what a forward needs and records what it installed.
class TiedParams {
 public:
  TiedParams() = default;
  /// Layouts of every tied parameter at stage `stage` of `partition`; both copies start equal
  /// (version 0 holds value 0). AP_CHECK: tied slots of different sizes or weight decay.
  TiedParams(const Model& model, const Partition& partition, int stage, Mode mode,
             int version_capacity);

  size_t size() const { return layouts_.size(); }
  TiedSync sync() const { return sync_; }
  const std::vector<TiedLayout>& layouts() const { return layouts_; }
  /// Parameter k's layout (AP_CHECK k < size()).
  const TiedLayout& layout(size_t k) const;
  /// The stage holds only the copy of k and follows its owner (follow_owner).
  bool follows(size_t k) const {
    return layouts_[k].role == TiedRole::copy && sync_ == TiedSync::follow_owner;
  }

  /// The owner's value the copy in stored version `version` holds; invalid when not recorded.
  TiedVersion held(int version, size_t k) const;
  void set_held(int version, size_t k, TiedVersion value);
  /// Forgets the versions `store` no longer holds.
  void forget_unstored(const WeightStore& store);

  /// Start of a run of `schedule` whose version 0 is absolute version `base`: records what the
  /// owner stage's forward of each microbatch computes with (follow_owner copies only). The owner
  /// predicts (`predicts`: xpipe) only past version 0.
  void plan_run(const Schedule& schedule, int base, int run_microbatches, bool predicts);
  /// What the owner's forward of schedule microbatch `microbatch` computed with (plan_run).
  TiedVersion owner_forward(int microbatch) const {
    return owner_f_[static_cast<size_t>(microbatch)];
  }

  /// begin_update: the update's copy slot carries what the newest version `latest` holds.
  void carry(int latest);
  /// commit_update: the new newest version `latest` (= `updates`) holds the carried value (a
  /// follow_owner copy) or its own; versions the store dropped are forgotten.
  void commit(const WeightStore& store, long updates);
  /// set_updates: the newest version `latest` is renamed to `updates`; a copy following its
  /// owner keeps its relative lag, every other side is current.
  void rename(int latest, int updates);
  /// 2bw: the previous version `prev` was added at rest; a copy following its owner gets the
  /// owner's value installed later, every other side holds its own.
  void add_previous(int prev);

 private:
  TiedSync sync_ = TiedSync::exchange_grads;
  std::vector<TiedLayout> layouts_;
  // per k: (version, owner value its copy slot holds)
  std::vector<std::vector<std::pair<int, TiedVersion>>> held_;
  std::vector<TiedVersion> carried_;  // per k: what the open update's copy slot holds
  // follow_owner copy: the owner stage's F per microbatch (version, lookahead), schedule-local
  std::vector<TiedVersion> owner_f_;
};

}  // namespace actorpipe
