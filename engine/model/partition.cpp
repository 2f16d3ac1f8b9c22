// Partition: the model's layers cut into d contiguous pipeline stages, either as evenly as
// possible or from explicit per-stage layer counts (pipeline.partition).
#include "engine/model/partition.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "kernels/check.hpp"

namespace actorpipe {

Expected<Partition> Partition::even(int num_layers, int stages) {
  if (stages < 1) return make_error("stages = {}: must be at least 1", stages);
  if (num_layers < stages) {
    return make_error("stages = {}: the model has only {} layers (at most one stage per layer)",
                      stages, num_layers);
  }
  std::vector<int> bounds{0};
  const int base = num_layers / stages, extra = num_layers % stages;
  for (int r = 0; r < stages; ++r) bounds.push_back(bounds.back() + base + (r < extra ? 1 : 0));
  return Partition(std::move(bounds));
}

Expected<Partition> Partition::from_counts(int num_layers, std::span<const int> counts) {
  const std::string shown = fmt::format("[{}]", fmt::join(counts, ", "));
  if (counts.empty()) return make_error("partition = []: needs one layer count per stage");
  std::vector<int> bounds{0};
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] < 1) {
      return make_error("partition = {}: stage {} has {} layers (every stage needs at least 1)",
                        shown, r, counts[r]);
    }
    bounds.push_back(bounds.back() + counts[r]);
  }
  if (bounds.back() != num_layers) {
    return make_error("partition = {}: sums to {} but the model has {} layers", shown,
                      bounds.back(), num_layers);
  }
  return Partition(std::move(bounds));
}

Expected<Partition> Partition::from_options(const PipelineOptions& p, int num_layers) {
  if (p.partition.automatic) {
    return make_error(
        "pipeline.partition = \"auto\": the planner chooses the partition before the stages are "
        "built (resolve_partition, engine/profiler/auto_partition.hpp; the trainer and the actor "
        "engine do it); here give \"even\" or layer counts");
  }
  auto part = p.partition.counts.empty() ? even(num_layers, p.stages)
                                         : from_counts(num_layers, p.partition.counts);
  if (!part) return make_error("pipeline.{}", part.error().message);
  if (part->stages() != p.stages) {
    return make_error("pipeline.partition = {}: {} entries but pipeline.stages = {}",
                      part->to_string(), part->stages(), p.stages);
  }
  return part;
}

int Partition::begin(int stage) const {
  AP_CHECK(stage >= 0 && stage < stages(), "stage {} outside [0, {})", stage, stages());
  return bounds_[static_cast<size_t>(stage)];
}

int Partition::end(int stage) const {
  AP_CHECK(stage >= 0 && stage < stages(), "stage {} outside [0, {})", stage, stages());
  return bounds_[static_cast<size_t>(stage) + 1];
}

int Partition::stage_of(int layer) const {
  AP_CHECK(layer >= 0 && layer < num_layers(), "layer {} outside [0, {})", layer, num_layers());
  int r = 0;
  while (bounds_[static_cast<size_t>(r) + 1] <= layer) ++r;
  return r;
}

std::vector<int> Partition::counts() const {
  std::vector<int> out;
  for (int r = 0; r < stages(); ++r) out.push_back(size(r));
  return out;
}

std::string Partition::to_string() const {
  return fmt::format("[{}]", fmt::join(counts(), ", "));
}

Expected<std::vector<bool>> recompute_flags(const RecomputeSpec& r, int num_layers) {
  std::vector<bool> flags(static_cast<size_t>(std::max(num_layers, 0)), false);
  switch (r.kind) {
    case RecomputeSpec::Kind::none:
      return flags;
    case RecomputeSpec::Kind::all:
      flags.assign(flags.size(), true);
      return flags;
    case RecomputeSpec::Kind::automatic:
      return make_error(
          "pipeline.recompute = \"auto\": the planner chooses the layers before the stages are "
          "built (resolve_partition, engine/profiler/auto_partition.hpp; the trainer and the actor "
          "engine do it); here give \"none\", \"all\" or layer indices");
    case RecomputeSpec::Kind::layers:
      break;
  }
  const std::string shown = fmt::format("[{}]", fmt::join(r.layers, ", "));
  for (int layer : r.layers) {
    if (layer < 0 || layer >= num_layers) {
      return make_error("pipeline.recompute = {}: layer {} is outside the model's layers 0 .. {}",
                        shown, layer, num_layers - 1);
    }
    if (flags[static_cast<size_t>(layer)]) {
      return make_error("pipeline.recompute = {}: layer {} is listed twice", shown, layer);
    }
    flags[static_cast<size_t>(layer)] = true;
  }
  return flags;
}

std::vector<int> recomputed_layers(const std::vector<bool>& flags) {
  std::vector<int> out;
  for (size_t i = 0; i < flags.size(); ++i)
    if (flags[i]) out.push_back(static_cast<int>(i));
  return out;
}

}  // namespace actorpipe
