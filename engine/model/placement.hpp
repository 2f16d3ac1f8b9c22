// Placement: which process (rank) of a job runs each pipeline stage. Pure data that every rank
// computes alike from the config and the world size.
#pragma once

#include <string>
#include <vector>

#include "engine/expected.hpp"

namespace actorpipe {

/// Stage -> rank for a pipeline of stages() stages on world() processes; every rank holds at
/// least one stage.
class Placement {
 public:
  /// Every stage on rank 0 of a one-process job.
  explicit Placement(int stages = 1);

  /// `ranks` (cluster.placement): one rank per stage, each in [0, world), every rank used; empty:
  /// contiguous blocks, stage s on rank floor(s * world / stages) (one stage per process when
  /// world == stages). Errors name the placement, the world and what is allowed.
  static Expected<Placement> make(const std::vector<int>& ranks, int stages, int world);
  /// Replica `replica` of `replicas` (pipeline.replicas) in a job of `world` processes: every
  /// replica runs on P = world / replicas consecutive ranks, replica q on q·P .. q·P + P - 1, and
  /// within them as make(ranks, stages, P) places one pipeline (`ranks`: cluster.placement, in
  /// 0 .. P-1). world() is the job's. Errors: a world that is not a multiple of `replicas`, and
  /// make()'s (naming P).
  static Expected<Placement> make(const std::vector<int>& ranks, int stages, int world,
                                  int replicas, int replica);
  /// The first rank of this pipeline's processes (replica·P; 0 without replicas).
  int first_rank() const { return first_; }
  /// Processes of this pipeline (P).
  int pipeline_world() const { return pipeline_world_; }

  int stages() const { return static_cast<int>(ranks_.size()); }
  int world() const { return world_; }
  int rank_of(int stage) const;
  /// The stages of `rank`, in order.
  std::vector<int> stages_of(int rank) const;
  const std::vector<int>& ranks() const { return ranks_; }
  /// "[0, 0, 1]".
  std::string describe() const;

 private:
  Placement(std::vector<int> ranks, int world)
      : ranks_(std::move(ranks)), world_(world), pipeline_world_(world) {}
  std::vector<int> ranks_;
  int world_ = 1;
  int first_ = 0;
  int pipeline_world_ = 1;
};

}  // namespace actorpipe
