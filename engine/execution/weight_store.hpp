// Weight-version store of one pipeline stage: immutable parameter versions (one buffer per layer
// of the stage), microbatches bound to the version their forward used, and the update policy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "engine/mode.hpp"

namespace actorpipe {

/// How many versions a stage keeps and where an update writes.
///  single           1 version, updated in place; an update with a microbatch in flight is an
///                   error (gpipe, 1f1b: the flush guarantees none).
///  double_buffered  2 versions (2bw): the newest and the one the current step's microbatches
///                   compute with; an update writes over the older one once it is unpinned.
///  ring             d−r versions at stage r (pipedream weight stashing): an update writes over
///                   the oldest version no microbatch in flight is bound to.
///  predicted        1 actual version updated in place (xpipe): a forward computes with a
///                   transient predicted copy made by the stage worker and the backward uses the
///                   actual weights at its time, so no microbatch pins a version.
enum class VersionPolicy : uint8_t { single, double_buffered, ring, predicted };

/// "single", "double_buffered", "ring", "predicted".
std::string_view to_string(VersionPolicy policy);

/// The policy of a mode: gpipe/1f1b single, 2bw double_buffered, pipedream ring, xpipe predicted.
VersionPolicy version_policy(Mode mode);

/// Versions a stage of the mode keeps: 1, 2, d − r, 1.
int version_capacity(Mode mode, int stages, int stage);

/// The versions of one stage. Version ids count the updates applied (version 0 is the initial
/// weights); a stored version is never written while it is the newest one or a microbatch in
/// flight is bound to it (except the in-place policies, see VersionPolicy). Violations are
/// programmer errors (AP_CHECK). Buffers are allocated up front: nothing allocates later.
class WeightStore {
 public:
  /// layer_floats: the parameter floats of each layer of the stage. capacity: the number of
  /// version buffers (1 for single and predicted). max_in_flight: the most microbatches bound
  /// at once (the stage's activation stash bound).
  WeightStore(VersionPolicy policy, int capacity, std::vector<size_t> layer_floats,
              int max_in_flight);

  VersionPolicy policy() const { return policy_; }
  int capacity() const { return static_cast<int>(ids_.size()); }
  int num_layers() const { return static_cast<int>(layer_offsets_.size()); }
  size_t layer_floats(int layer) const;

  /// Id of the newest version.
  int latest() const { return ids_[static_cast<size_t>(latest_buffer_)]; }
  /// True when `version` is stored.
  bool holds(int version) const { return find(version) >= 0; }
  /// Every stored version, ascending.
  std::vector<int> versions() const;
  /// Parameters of layer `layer` (of the stage) in stored version `version`.
  std::span<const float> params(int version, int layer) const;

  /// A stored version's buffer, writable, for initialisation, checkpoint loading and the tied
  /// weights a stage receives: only while no microbatch in flight is bound to that version
  /// (never under a saved activation).
  std::span<float> mutable_params(int version, int layer);
  /// Forgets every version but the newest one and renames it `version` (a resume, or a new run
  /// that starts its version count afresh). Only while no microbatch is bound.
  void reset(int version);
  /// Makes the free buffer hold `version`, older than latest() (a resume that restores the
  /// version before the newest one: 2bw's previous version); write it with mutable_params().
  /// Only when a buffer holds no version, `version` is not stored and no update is open.
  void add_older(int version);

  /// A microbatch's forward computes with `version` (which must be stored) and its backward will
  /// use the same buffer: the version stays stored until release(). Not for `predicted`.
  void bind(int microbatch, int version);
  /// The version `microbatch` is bound to, or -1.
  int bound_version(int microbatch) const;
  /// The microbatch's backward is done.
  void release(int microbatch);
  /// Microbatches bound now.
  int in_flight() const { return static_cast<int>(bound_.size()); }

  /// Starts the update that produces version latest() + 1 and returns nothing; update_params()
  /// then gives its buffers, holding a copy of the newest version (or the newest version itself,
  /// updated in place, when capacity() is 1). Fails when every buffer is pinned.
  void begin_update();
  /// Layer `layer`'s buffer of the version being produced (between begin_update and commit).
  std::span<float> update_params(int layer);
  /// The produced version becomes the newest one.
  void commit_update();

  /// Counts the changes a buffer's content may have seen: every writable access
  /// (mutable_params, update_params), begin_update's copy, commit_update, reset and add_older
  /// add one. Equal values mean no buffer was written in between (the bf16 weight copies of
  /// kernels/bf16_weights.hpp are kept while it stays the same).
  uint64_t generation() const { return generation_; }
  /// Every version buffer (allocated up front; they never move).
  std::vector<std::span<const float>> buffers() const;

  /// Versions that are the newest or bound by a microbatch in flight, now / at most so far.
  int versions_pinned() const;
  int peak_versions() const { return peak_versions_; }

 private:
  int find(int version) const;  // buffer index, or -1
  int bound_index(int microbatch) const;
  bool pinned(int buffer) const;
  void note_peak();

  VersionPolicy policy_;
  std::vector<size_t> layer_offsets_;  // per layer, floats from the buffer start
  std::vector<size_t> layer_sizes_;
  std::vector<std::vector<float>> buffers_;  // one per version slot, every layer inside
  std::vector<int> ids_;                     // version held by each buffer, -1 = none
  int latest_buffer_ = 0;
  int updating_ = -1;                       // buffer being written, -1 = no update open
  std::vector<std::pair<int, int>> bound_;  // (microbatch, buffer)
  size_t max_in_flight_ = 0;
  int peak_versions_ = 1;
  uint64_t generation_ = 0;
};

}  // namespace actorpipe
