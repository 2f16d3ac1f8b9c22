// Partition: the model's layers cut into d contiguous pipeline stages, either as evenly as
// possible or from explicit per-stage layer counts (pipeline.partition).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "engine/options.hpp"

namespace actorpipe {

/// Stage r holds the global layers [begin(r), end(r)). Every stage holds at least one layer and
/// the stages cover the layers in order.
class Partition {
 public:
  /// "Even": n layers over d stages, the first n % d stages one layer more than the others
  /// (the last stage holds the head, usually the heaviest layer).
  /// Errors: stages < 1, or more stages than layers.
  static Expected<Partition> even(int num_layers, int stages);

  /// Explicit layer counts, one per stage. Errors (naming the counts): an empty list, a count
  /// < 1, or counts that do not sum to num_layers.
  static Expected<Partition> from_counts(int num_layers, std::span<const int> counts);

  /// pipeline.stages and pipeline.partition (no counts = even) for a model of num_layers
  /// layers; errors name the config keys. "auto" is an error: resolve_partition
  /// (engine/profiler/auto_partition.hpp) turns it into counts first.
  static Expected<Partition> from_options(const PipelineOptions& pipeline, int num_layers);

  int stages() const { return static_cast<int>(bounds_.size()) - 1; }
  int num_layers() const { return bounds_.back(); }
  /// First global layer of stage r.
  int begin(int stage) const;
  /// One past the last global layer of stage r.
  int end(int stage) const;
  /// Layers held by stage r.
  int size(int stage) const { return end(stage) - begin(stage); }
  /// The stage holding global layer `layer`.
  int stage_of(int layer) const;
  /// Layer counts per stage, e.g. {2, 2, 1}.
  std::vector<int> counts() const;
  /// "[2, 2, 1]".
  std::string to_string() const;

  friend bool operator==(const Partition&, const Partition&) = default;

 private:
  explicit Partition(std::vector<int> bounds) : bounds_(std::move(bounds)) {}
  std::vector<int> bounds_;  // d+1 entries: 0 = bounds_[0] < bounds_[1] < ... = num_layers
};

/// pipeline.recompute as one flag per global layer of a model of num_layers layers: none, all,
/// or the listed layers. Errors name the key: a layer outside [0, num_layers), a layer listed
/// twice, and "auto" (resolve_partition, engine/profiler/auto_partition.hpp, turns it into the
/// planner's layers first).
Expected<std::vector<bool>> recompute_flags(const RecomputeSpec& recompute, int num_layers);

/// The global layers recomputed: the indices of the true flags, ascending.
std::vector<int> recomputed_layers(const std::vector<bool>& flags);

}  // namespace actorpipe
