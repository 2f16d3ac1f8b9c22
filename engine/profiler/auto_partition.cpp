// Auto partition: pipeline.partition = "auto" — the layer profile (measured, or read from the
// cache), the bytes the model implies and the planner's plan for the configured pipeline.
#include "engine/profiler/auto_partition.hpp"

#include <fmt/format.h>

#include "engine/mode.hpp"
#include "engine/profiler/profile_cache.hpp"

namespace actorpipe {

Expected<PlannerOptions> planner_options(const Config& config) {
  const PipelineOptions& p = config.pipeline;
  auto mode = parse_mode(p.mode);
  if (!mode) return mode.error();
  if (p.memory_limit_mb < 0)
    return make_error("pipeline.memory_limit_mb = {}: must be >= 0", p.memory_limit_mb);
  PlannerOptions o;
  o.mode = *mode;
  o.stages = p.stages;
  o.microbatches = p.microbatches;
  o.memory_limit_bytes = std::int64_t{p.memory_limit_mb} << 20;
  o.split_backward = p.split_backward;
  return o;
}

Expected<AutoPartition> plan_auto_partition(const Config& config,
                                            const AutoPartitionOptions& options) {
  auto planner = planner_options(config);
  if (!planner) return planner.error();
  if (options.reps < 1) return make_error("auto partition: reps = {}, expected >= 1", options.reps);
  AutoPartition out;
  out.planner = *planner;
  const ProfileKey key = profile_key(config);
  const int num_layers = config.model.depth + 2;
  const std::string dir =
      options.cache_dir.empty() ? default_profile_cache_dir() : options.cache_dir;
  if (dir.empty()) {
    out.cache_note = "no cache directory (ACTORPIPE_CACHE_DIR, XDG_CACHE_HOME and HOME unset)";
  } else if (!options.read_cache) {
    out.cache_note =
        options.write_cache ? "re-profiling as asked" : "the cache is not used, as asked";
  } else {
    CachedProfile cached = read_cached_profile(dir, key, num_layers);
    out.cache_path = cached.path;
    if (cached.profile) {
      out.profile = std::move(*cached.profile);
      out.from_cache = true;
    } else {
      out.cache_note = cached.note;
    }
  }
  if (!out.from_cache) {
    auto measured =
        profile_layers(config.model, config.optimizer, key.B, key.T, key.threads, options.reps);
    if (!measured) return measured.error();
    out.profile = std::move(*measured);
    if (!dir.empty() && options.write_cache) {
      auto written = write_cached_profile(dir, key, out.profile);
      if (written) {
        out.cache_path = *written;
      } else {
        out.cache_note += "; not cached: " + written.error().message;
      }
    }
  }
  auto costs = layer_costs(out.profile, config.model, config.optimizer);
  if (!costs) return costs.error();
  out.costs = std::move(*costs);

  // The engine recomputes nothing yet: plan with recompute saving nothing, so the planner never
  // chooses it. Only when that cannot fit, ask the planner what recompute would do, to say so.
  std::vector<LayerCosts> kept = out.costs;
  for (LayerCosts& c : kept) c.recompute_activation_bytes = c.activation_bytes;
  auto plan = plan_partition(kept, out.planner);
  if (plan) {
    out.result = std::move(*plan);
    return out;
  }
  auto with_recompute = plan_partition(out.costs, out.planner);
  if (!with_recompute) return with_recompute.error();
  const PartitionPlan& r = with_recompute->plan;
  if (r.recomputed_layers == 0) return plan.error();
  std::vector<int> layers;
  for (size_t i = 0; i < r.recompute.size(); ++i)
    if (r.recompute[i]) layers.push_back(static_cast<int>(i));
  return make_error(
      "the plan {} needs recompute of layers {{{}}} to fit pipeline.memory_limit_mb = {} MiB per "
      "stage, which the engine does not support yet (there is no pipeline.recompute); raise the "
      "limit, or use more stages or fewer microbatches",
      fmt::format("[{}]", fmt::join(r.layers_per_stage, ", ")), fmt::join(layers, ", "),
      config.pipeline.memory_limit_mb);
}

Expected<Config> resolve_partition(const Config& config, const AutoPartitionOptions& options) {
  if (!config.pipeline.partition.automatic) return config;
  auto a = plan_auto_partition(config, options);
  if (!a) return make_error("pipeline.partition = \"auto\": {}", a.error().message);
  Config out = config;
  out.pipeline.partition.automatic = false;
  out.pipeline.partition.counts = a->result.plan.layers_per_stage;
  return out;
}

}  // namespace actorpipe
