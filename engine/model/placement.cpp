// Placement: which process (rank) of a job runs each pipeline stage. Pure data that every rank
// computes alike from the config and the world size.
#include "engine/model/placement.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/check.hpp"

namespace actorpipe {

Placement::Placement(int stages) : ranks_(static_cast<size_t>(std::max(stages, 1)), 0) {}

Expected<Placement> Placement::make(const std::vector<int>& ranks, int stages, int world) {
  if (stages < 1) return make_error("placement: {} stages, expected >= 1", stages);
  if (world < 1) return make_error("placement: a job of {} processes, expected >= 1", world);
  if (world > stages) {
    return make_error(
        "a job of {} processes for a pipeline of {} stages: every process runs at least one "
        "stage (allowed: at most pipeline.stages = {} processes)",
        world, stages, stages);
  }
  std::vector<int> out;
  if (ranks.empty()) {
    for (int s = 0; s < stages; ++s)
      out.push_back(static_cast<int>(static_cast<long>(s) * world / stages));
  } else {
    const std::string shown = fmt::format("[{}]", fmt::join(ranks, ", "));
    if (static_cast<int>(ranks.size()) != stages) {
      return make_error(
          "cluster.placement = {}: {} entries for {} stages (allowed: one rank per "
          "stage)",
          shown, ranks.size(), stages);
    }
    std::vector<int> held(static_cast<size_t>(world), 0);
    for (int r : ranks) {
      if (r < 0 || r >= world) {
        return make_error(
            "cluster.placement = {}: rank {} outside the job's ranks [0, {}) (allowed: ranks "
            "of the {} processes)",
            shown, r, world, world);
      }
      ++held[static_cast<size_t>(r)];
    }
    for (int r = 0; r < world; ++r) {
      if (held[static_cast<size_t>(r)] == 0) {
        return make_error(
            "cluster.placement = {}: rank {} of the {} processes runs no stage (allowed: every "
            "rank holds at least one stage)",
            shown, r, world);
      }
    }
    out = ranks;
  }
  return Placement(std::move(out), world);
}

Expected<Placement> Placement::make(const std::vector<int>& ranks, int stages, int world,
                                    int replicas, int replica) {
  if (replicas < 1 || replica < 0 || replica >= replicas)
    return make_error("placement: replica {} of {}", replica, replicas);
  if (world < replicas || world % replicas != 0) {
    return make_error(
        "a job of {} processes for pipeline.replicas = {}: every replica runs on as many "
        "processes as the others (allowed: a multiple of {} processes)",
        world, replicas, replicas);
  }
  const int per = world / replicas;
  auto one = make(ranks, stages, per);
  if (!one) {
    if (replicas == 1) return one.error();
    return make_error("each of the {} replicas runs on {} of the {} processes: {}", replicas, per,
                      world, one.error().message);
  }
  std::vector<int> out = one->ranks_;
  for (int& r : out) r += replica * per;
  Placement p(std::move(out), world);
  p.first_ = replica * per;
  p.pipeline_world_ = per;
  return p;
}

int Placement::rank_of(int stage) const {
  AP_CHECK(stage >= 0 && stage < stages(), "stage {} of {}", stage, stages());
  return ranks_[static_cast<size_t>(stage)];
}

std::vector<int> Placement::stages_of(int rank) const {
  std::vector<int> out;
  for (int s = 0; s < stages(); ++s)
    if (ranks_[static_cast<size_t>(s)] == rank) out.push_back(s);
  return out;
}

std::string Placement::describe() const {
  return fmt::format("[{}]", fmt::join(ranks_, ", "));
}

}  // namespace actorpipe
