// Weight-version store of one pipeline stage: immutable parameter versions (one buffer per layer
// of the stage), microbatches bound to the version their forward used, and the update policy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "engine/execution/page_buffer.hpp"
#include "engine/mode.hpp"
#include "kernels/backend_memory.hpp"
#include "kernels/bf16.hpp"

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

/// Floats [offset, offset + n) of local layer `layer`: a parameter slot that a bf16 weight stash
/// keeps in bf16 only in the versions that are not the newest (ParamSlot::product_operand).
struct StashRange {
  int layer = 0;
  size_t offset = 0;
  size_t n = 0;
};

/// The versions of one stage. Version ids count the updates applied (version 0 is the initial
/// weights); a stored version is never written while it is the newest one or a microbatch in
/// flight is bound to it (except the in-place policies, see VersionPolicy). Violations are
/// programmer errors (AP_CHECK). Buffers are allocated up front: nothing allocates later.
///
/// bf16 stash (`bf16_stash` given, capacity >= 2: 2bw, and pipedream below its last stage): buffer
/// 0 always holds the newest version in f32 and an update writes it in place; begin_update first
/// makes the newest version a stashed one in another buffer, where the `bf16_stash` ranges are
/// kept only as their bf16 rounding (stashed_bf16; their f32 pages are given back) and everything
/// else in f32. A bf16 product of a stashed version then takes exactly the operand a bf16 product
/// of the f32 version takes, so nothing a stage computes changes; a stashed version's f32 view
/// (params) holds zeros in those ranges, which only products may read. mutable_params of a
/// stashed version widens its layer's ranges back to f32 until settle() rounds them again.
class WeightStore {
 public:
  /// layer_floats: the parameter floats of each layer of the stage. capacity: the number of
  /// version buffers (1 for single and predicted). max_in_flight: the most microbatches bound
  /// at once (the stage's activation stash bound). bf16_stash: the ranges stashed versions keep
  /// in bf16 only (ascending, disjoint, within their layers); empty = every version in f32. Only
  /// for double_buffered and ring; ignored with one buffer (nothing is stashed).
  /// memory: where the version buffers live (it must outlive the store). Host memory keeps them
  /// in PageBuffers; other memory (a device's) in its own allocations, where params() and the
  /// other spans point into that memory, begin_update copies through it, and no bf16 stash is
  /// kept (refused: it rounds on the host).
  WeightStore(VersionPolicy policy, int capacity, std::vector<size_t> layer_floats,
              int max_in_flight, std::vector<StashRange> bf16_stash = {},
              BackendMemory& memory = host_backend_memory());

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

  /// Counts the changes layer `layer`'s part of buffer `buffer` may have seen: a writable
  /// access to that layer of it (mutable_params, update_params) and settle() giving pages of it
  /// back add one; begin_update's copy into a buffer and add_older of it add one to each of its
  /// layers. Equal values mean those floats were not written in between (the bf16 weight copies
  /// of kernels/bf16_weights.hpp are kept while it stays the same). commit_update adds one to
  /// each layer of the buffer it makes the newest (its writer is done), and none to the others;
  /// reset renames and adds none.
  uint64_t generation(int buffer, int layer) const;
  /// Every version buffer (allocated up front; they never move), buffer b at index b.
  std::vector<std::span<const float>> buffers() const;
  /// Layer `layer`'s floats in buffer b (whatever version it holds).
  std::span<const float> buffer(int b, int layer) const;

  /// True when stashed versions keep the bf16_stash ranges in bf16 only.
  bool bf16_stash() const { return !stash_.empty(); }
  /// The bf16 values of w[0, n) when those floats lie in a bf16_stash range of a stashed version
  /// kept in bf16 (the operand a product reads instead of w); nullptr otherwise (w's floats are
  /// f32 and valid). A request that straddles such a range is a programmer error.
  const bf16* stashed_bf16(const float* w, size_t n) const;
  /// The same for floats [offset, offset + n) of layer `layer` in stored version `version`.
  const bf16* stashed_bf16(int version, int layer, size_t offset, size_t n) const;
  /// Rounds back to bf16 the stashed layers that mutable_params widened, and gives their f32
  /// pages back. A stage calls it before it computes; cheap when nothing was written.
  void settle();
  /// Bytes the version buffers hold now: their resident pages (PageBuffer::resident_bytes) and
  /// the stashed versions' bf16 values; in memory other than the host's, what was allocated.
  size_t resident_bytes() const;

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
  int update_target() const;  // the buffer an update writes over (or stashes into)
  bool stashed(int buffer) const { return !stash_.empty() && buffer != 0; }
  void stash_newest(int buffer);  // bf16 stash: the newest version (buffer 0) into `buffer`
  void widen(int buffer, int layer);
  int stash_range_at(size_t offset, size_t n) const;  // index into stash_, or -1

  BackendMemory* memory_ = nullptr;
  // one per version slot, every layer inside: host pages, or allocations of memory_ when that is
  // not host memory; base_[b] is buffer b's first float either way
  std::vector<PageBuffer> buffers_;
  std::vector<BackendBuffer> allocations_;
  std::vector<float*> base_;
  size_t total_ = 0;      // floats per buffer
  std::vector<int> ids_;  // version held by each buffer, -1 = none
  int latest_buffer_ = 0;
  int updating_ = -1;                       // buffer being written, -1 = no update open
  std::vector<std::pair<int, int>> bound_;  // (microbatch, buffer)
  size_t max_in_flight_ = 0;
  int peak_versions_ = 1;
  std::vector<uint64_t> generations_;  // per buffer and layer (generation()), buffer-major
  void changed(int buffer);            // every layer of it
  void changed(int buffer, int layer);
  // bf16 stash: the ranges (offsets from the buffer start), where each one's bf16 values start
  // in a stashed buffer's bf16 array, and per buffer that array and which layers are widened
  struct Range {
    int layer = 0;
    size_t at = 0;  // floats from the buffer start
    size_t n = 0;
    size_t bf16_at = 0;
  };
  std::vector<Range> stash_;
  std::vector<std::vector<bf16>> stash_bf16_;
  std::vector<std::vector<char>> widened_;
};

}  // namespace actorpipe
