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
  /// A model of one's own layers (Model::from_layers) that config.model describes: profiled
  /// instead of the built-in model, and never cached (the cache is keyed by the built-in
  /// model's options). Null: the built-in model of config.model.
  const Model* model = nullptr;
};

/// What plan_auto_partition found.
struct AutoPartition {
  LayerProfile profile;
  std::vector<LayerCosts> costs;  ///< the planner's input, one per layer
  PlannerOptions planner;         ///< what the plan is for
  PlannerResult result;           ///< the plan, its runner-up and their ranking
  /// The recompute flags the stages will use, one per global layer: the plan's (its
  /// PartitionPlan::recompute; the configured ones unless pipeline.recompute = "auto").
  std::vector<bool> recompute;
  bool from_cache = false;  ///< the profile was read from cache_path
  std::string cache_path;   ///< the cache file read or written; empty = none
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
/// for the configured mode, stages and microbatches under pipeline.memory_limit_mb:
///  - pipeline.recompute = "auto": the planner chooses the recompute flags, and the partition
///    too when pipeline.partition = "auto"; with a partition given ("even" or counts) only the
///    flags of that partition (PlannerOptions::layers_per_stage). Without a limit nothing is
///    recomputed (recompute only costs time).
///  - otherwise the configured layers are recomputed (none, all, a list): the planner sees
///    their costs recomputed (input stashed, forward added to the backward) and chooses the
///    partition alone; pipeline.partition is then ignored (actorpipe-plan plans any config).
/// When recompute = "none" and only recompute would fit the limit, the error names the layers
/// "auto" would recompute; when nothing fits, it is the planner's error naming the stage, its
/// bytes and the limit.
Expected<AutoPartition> plan_auto_partition(const Config& config,
                                            const AutoPartitionOptions& options = {});

/// pipeline.partition or pipeline.recompute is "auto": the stages need the planner first.
bool plans_automatically(const PipelineOptions& pipeline);

/// `config` with pipeline.partition = "auto" replaced by the counts of plan_auto_partition's
/// plan and pipeline.recompute = "auto" by its recomputed layers (a list, or "none"); any other
/// config unchanged (nothing is measured). Errors are plan_auto_partition's, prefixed
/// `pipeline.partition = "auto": ` (or `pipeline.recompute = "auto": `).
Expected<Config> resolve_partition(const Config& config, const AutoPartitionOptions& options = {});

}  // namespace actorpipe
