// Auto partition: pipeline.partition = "auto" — the layer profile (measured, or read from the
// cache), the bytes the model implies and the planner's plan for the configured pipeline.
#pragma once

#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "engine/options.hpp"
#include "engine/planner/planner.hpp"
#include "engine/profiler/profiler.hpp"

namespace actorpipe {

/// Where the profile comes from.
struct AutoPartitionOptions {
  /// The cache directory; empty = default_profile_cache_dir() (which may be empty too: then
  /// nothing is read or written).
  std::string cache_dir;
  bool read_cache = true;   ///< use a cached profile of the same key; false = measure again
  bool write_cache = true;  ///< store a measured profile
  int reps = 5;             ///< calls timed per layer and kind (medians)
};

/// What plan_auto_partition found.
struct AutoPartition {
  LayerProfile profile;
  std::vector<LayerCosts> costs;  ///< the planner's input, one per layer
  PlannerOptions planner;         ///< what the plan is for
  PlannerResult result;           ///< the plan, its runner-up and their ranking
  bool from_cache = false;        ///< the profile was read from cache_path
  std::string cache_path;         ///< the cache file read or written; empty = none
  /// Why no cached profile was used ("no cached profile", "ignored: ...", "re-profiling as
  /// asked", "the cache is not used, as asked"), and why none was written ("; not cached:
  /// ..."); empty when the cache was used.
  std::string cache_note;
};

/// The planner's options for `config`: pipeline.mode, stages, microbatches, split_backward,
/// memory_limit_mb (MiB) as bytes; transfers free (one process: a hand-off moves no bytes).
Expected<PlannerOptions> planner_options(const Config& config);

/// Profiles the model of `config` (pipeline.microbatch_size, the sequence length,
/// pipeline.threads_per_stage, the optimizer), or reads that profile from the cache, and plans
/// the partition for the configured mode, stages and microbatches under
/// pipeline.memory_limit_mb. The engine does not recompute layers yet, so the plan is made
/// without recompute; when only recompute would fit the limit, the error says which layers the
/// planner would recompute and that pipeline.recompute does not exist yet; when nothing fits,
/// it is the planner's error naming the stage, its bytes and the limit. Whatever
/// pipeline.partition holds is ignored (actorpipe-plan plans any config).
Expected<AutoPartition> plan_auto_partition(const Config& config,
                                            const AutoPartitionOptions& options = {});

/// `config` with pipeline.partition = "auto" replaced by the counts of plan_auto_partition's
/// plan; any other config unchanged (nothing is measured). Errors are plan_auto_partition's,
/// prefixed `pipeline.partition = "auto": `.
Expected<Config> resolve_partition(const Config& config, const AutoPartitionOptions& options = {});

}  // namespace actorpipe
