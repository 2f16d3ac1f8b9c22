// Job plan: what the processes of a job plan once and all take — the partition and recompute
// flags of "auto", and with pipeline.replicas = 0 the width and depth — planned by rank 0 from
// its profile and handed to the others, so every process builds the same pipeline.
#pragma once

#include "engine/expected.hpp"
#include "engine/options.hpp"
#include "engine/profiler/auto_partition.hpp"

namespace actorpipe {

class ProcessGroup;

/// `config` with every "auto" resolved.
///  - One process (no group, or a world of 1): resolve_partition; pipeline.replicas = 0 becomes 1
///    (the stages of one process are threads: pipeline.stages stays).
///  - A job: rank 0 plans and every rank takes rank 0's values from one all-gather of `group`
///    (the others measure nothing, so no two processes can plan differently). With
///    pipeline.replicas = 0 rank 0 ranks every split of the job's processes into w replicas of
///    d stages (plan_width_depth, one stage per process) from its layer profile and the
///    all-reduce measured on the spot (measure_all_reduce_cost), and takes the first:
///    pipeline.replicas = w, pipeline.stages = d, the partition, and the recompute flags when
///    those are "auto". Otherwise resolve_partition as in one process.
/// Every call is one all-gather on every rank (none when nothing is "auto"). Errors: rank 0's
/// planning error (on every rank, naming rank 0), the all-gather's (a lost rank; rank 0's
/// planning must end within cluster.connect_timeout, which a cached profile makes instant).
Expected<Config> plan_job(const Config& config, ProcessGroup* group,
                          const AutoPartitionOptions& planning);

/// pipeline.replicas = 0, pipeline.partition or pipeline.recompute = "auto".
bool plans_job(const PipelineOptions& pipeline);

}  // namespace actorpipe
