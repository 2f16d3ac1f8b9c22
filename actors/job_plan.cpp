// Job plan: rank 0 resolves every "auto" of the config and the other ranks take its values.
#include "actors/job_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "actors/process_group.hpp"
#include "engine/config/config.hpp"
#include "engine/config/option_table.hpp"
#include "engine/planner/width_depth.hpp"
#include "transport/gloo_bandwidth.hpp"

namespace actorpipe {

namespace {

// The keys a plan decides, as --set assignments rank 0 sends.
constexpr const char* kPlanned[] = {"pipeline.replicas", "pipeline.stages", "pipeline.partition",
                                    "pipeline.recompute"};

std::string assignments(const Config& c) {
  std::string out;
  for (const char* name : kPlanned) {
    const std::string key(name);
    const internal::OptionSpec* spec =
        internal::find_option(key.substr(0, key.find('.')), key.substr(key.find('.') + 1));
    out += key + "=" + internal::to_toml_text(spec->kind, spec->get(c)) + "\n";
  }
  return out;
}

// Rank 0's plan for the job's `world` processes.
Expected<Config> plan_here(const Config& config, int world, const AutoPartitionOptions& planning) {
  if (config.pipeline.replicas != 0) return resolve_partition(config, planning);
  auto profiled = plan_auto_partition(config, planning);
  if (!profiled) return make_error("pipeline.replicas = 0: {}", profiled.error().message);
  std::int64_t grad = 0;
  for (const LayerCosts& l : profiled->costs) grad += l.gradient_bytes;
  auto cost = measure_all_reduce_cost(std::max<std::int64_t>(1, grad / 2 / 4), 5);
  if (!cost) return make_error("pipeline.replicas = 0: {}", cost.error().message);
  PlannerOptions base = profiled->planner;
  base.microbatches = config.pipeline.microbatches;
  base.stage_speed.clear();
  base.allreduce_bandwidth = cost->bandwidth;
  base.allreduce_latency = cost->latency;
  auto wd = plan_width_depth(profiled->costs, base, world);
  if (!wd) return make_error("pipeline.replicas = 0: {}", wd.error().message);
  const WidthDepthPlan& best = wd->ranked.front();
  Config out = config;
  out.pipeline.replicas = best.replicas;
  out.pipeline.stages = best.stages;
  out.pipeline.partition.automatic = false;
  out.pipeline.partition.counts = best.plan.layers_per_stage;
  if (config.pipeline.recompute.kind == RecomputeSpec::Kind::automatic) {
    std::vector<int> layers;
    for (size_t i = 0; i < best.plan.recompute.size(); ++i)
      if (best.plan.recompute[i]) layers.push_back(static_cast<int>(i));
    out.pipeline.recompute.kind =
        layers.empty() ? RecomputeSpec::Kind::none : RecomputeSpec::Kind::layers;
    out.pipeline.recompute.layers = layers;
  }
  return out;
}

}  // namespace

bool plans_job(const PipelineOptions& pipeline) {
  return pipeline.replicas == 0 || plans_automatically(pipeline);
}

Expected<Config> plan_job(const Config& config, ProcessGroup* group,
                          const AutoPartitionOptions& planning) {
  if (group == nullptr || group->world() == 1) {
    Config one = config;
    if (one.pipeline.replicas == 0) one.pipeline.replicas = 1;
    return resolve_partition(one, planning);
  }
  if (!plans_job(config.pipeline)) return config;
  RankPart mine;
  if (group->rank() == 0) {
    auto planned = plan_here(config, group->world(), planning);
    mine.text = planned ? "ok\n" + assignments(*planned) : "error\n" + planned.error().message;
  }
  auto parts = group->all_gather(std::move(mine));
  if (!parts) return make_error("planning the job: {}", parts.error().message);
  const std::string& text = (*parts)[0].text;
  if (text.rfind("error\n", 0) == 0) {
    return make_error("rank 0 planned the job: {}", text.substr(6));
  }
  Config out = config;
  size_t at = text.find('\n') + 1;
  for (size_t nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) {
    if (Status ok = apply_set(out, text.substr(at, nl - at)); !ok)
      return make_error("rank 0's plan \"{}\": {}", text.substr(at, nl - at), ok.error().message);
  }
  if (Status ok = validate(out); !ok) return make_error("rank 0's plan: {}", ok.error().message);
  return out;
}

}  // namespace actorpipe
