// Auto partition: pipeline.partition = "auto" — the layer profile (measured, or read from the
// cache), the bytes the model implies and the planner's plan for the configured pipeline.
#include "engine/profiler/auto_partition.hpp"

#include <fmt/format.h>

#include "engine/mode.hpp"
#include "engine/model/partition.hpp"
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
  const Precision precision = parse_precision(key.precision).value_or(Precision::fp32);
  const int num_layers =
      options.model != nullptr ? options.model->num_layers() : config.model.depth + 2;
  const std::string dir = options.model != nullptr    ? std::string()
                          : options.cache_dir.empty() ? default_profile_cache_dir()
                                                      : options.cache_dir;
  if (options.model != nullptr) {
    out.cache_note =
        "a model of one's own layers is profiled each time (the cache holds the "
        "built-in models' profiles)";
  } else if (dir.empty()) {
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
    auto measured = options.model != nullptr
                        ? profile_layers(*options.model, config.optimizer, key.B, key.T,
                                         key.threads, options.reps, precision)
                        : profile_layers(config.model, config.optimizer, key.B, key.T, key.threads,
                                         options.reps, precision);
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
  const bool bf16_stash = config.pipeline.stash_precision == "bf16";
  auto costs =
      options.model != nullptr
          ? layer_costs(out.profile, *options.model, config.optimizer, precision, bf16_stash)
          : layer_costs(out.profile, config.model, config.optimizer, precision, bf16_stash);
  if (!costs) return costs.error();
  out.costs = std::move(*costs);

  const int n = static_cast<int>(out.costs.size());
  const RecomputeSpec& spec = config.pipeline.recompute;
  const bool automatic = spec.kind == RecomputeSpec::Kind::automatic;
  std::vector<bool> forced(static_cast<size_t>(n), false);
  if (!automatic) {
    auto flags = recompute_flags(spec, n);
    if (!flags) return flags.error();
    forced = std::move(*flags);
  }
  // recompute = "auto" with a partition given: plan the recompute flags of that partition
  if (automatic && !config.pipeline.partition.automatic) {
    auto part = Partition::from_options(config.pipeline, n);
    if (!part) return part.error();
    out.planner.layers_per_stage = part->counts();
  }
  // The planner chooses recompute only for "auto". Otherwise no layer may save anything by it,
  // and a layer the config recomputes costs what it costs recomputed: its input stashed, its
  // forward once more in the backward.
  std::vector<LayerCosts> planned = out.costs;
  if (!automatic) {
    for (size_t k = 0; k < planned.size(); ++k) {
      LayerCosts& c = planned[k];
      if (forced[k]) {
        c.activation_bytes = c.recompute_activation_bytes;
        c.backward += c.forward;
      }
      c.recompute_activation_bytes = c.activation_bytes;
    }
  }
  auto plan = plan_partition(planned, out.planner);
  if (plan) {
    out.result = std::move(*plan);
    if (!automatic) {
      // the plans' flags and times say what the stages will recompute
      auto mark = [&](PartitionPlan& p) {
        p.recompute = forced;
        p.recomputed_layers = 0;
        for (StagePlan& st : p.stages) {
          st.recomputed = 0;
          st.recompute_seconds = 0.0;
          for (int k = st.first_layer; k < st.first_layer + st.layers; ++k) {
            if (!forced[static_cast<size_t>(k)]) continue;
            ++st.recomputed;
            st.recompute_seconds += out.costs[static_cast<size_t>(k)].forward;
          }
          p.recomputed_layers += st.recomputed;
        }
      };
      mark(out.result.plan);
      if (out.result.runner_up) mark(*out.result.runner_up);
      for (PartitionPlan& p : out.result.ranked) mark(p);
    }
    out.recompute = out.result.plan.recompute;
    return out;
  }
  if (spec.kind != RecomputeSpec::Kind::none) return plan.error();
  // without recompute nothing fits: say what "auto" would recompute
  auto with_recompute = plan_partition(out.costs, out.planner);
  if (!with_recompute) return with_recompute.error();
  const PartitionPlan& r = with_recompute->plan;
  if (r.recomputed_layers == 0) return plan.error();
  return make_error(
      "the plan {} needs recompute of layers {{{}}} to fit pipeline.memory_limit_mb = {} MiB per "
      "stage, but pipeline.recompute = \"none\": set pipeline.recompute = \"auto\" (or those "
      "layers), raise the limit, or use more stages or fewer microbatches",
      fmt::format("[{}]", fmt::join(r.layers_per_stage, ", ")),
      fmt::join(recomputed_layers(r.recompute), ", "), config.pipeline.memory_limit_mb);
}

bool plans_automatically(const PipelineOptions& p) {
  return p.partition.automatic || p.recompute.kind == RecomputeSpec::Kind::automatic;
}

Expected<Config> resolve_partition(const Config& config, const AutoPartitionOptions& options) {
  if (!plans_automatically(config.pipeline)) return config;
  auto a = plan_auto_partition(config, options);
  if (!a) {
    return make_error("pipeline.{} = \"auto\": {}",
                      config.pipeline.partition.automatic ? "partition" : "recompute",
                      a.error().message);
  }
  Config out = config;
  if (config.pipeline.partition.automatic) {
    out.pipeline.partition.automatic = false;
    out.pipeline.partition.counts = a->result.plan.layers_per_stage;
  }
  if (config.pipeline.recompute.kind == RecomputeSpec::Kind::automatic) {
    const std::vector<int> layers = recomputed_layers(a->recompute);
    out.pipeline.recompute.kind =
        layers.empty() ? RecomputeSpec::Kind::none : RecomputeSpec::Kind::layers;
    out.pipeline.recompute.layers = layers;
  }
  return out;
}

}  // namespace actorpipe
