// Layer move across processes: every process of a job takes a new partition at the same
// boundary. Each exports what its rebuilt stages held (by layer-granular checkpoint name), sends
// each layer's state to the process that runs the layer's new stage (safetensors bytes over
// UCX: ucx_exchange), builds and loads its rebuilt stages, and only when every process has
// built its stages do they all take their places.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/expected.hpp"
#include "engine/migration/layer_move.hpp"
#include "engine/model/partition.hpp"
#include "engine/model/placement.hpp"

namespace actorpipe {

class OptimizerShard;
class ProcessGroup;
class StageWorker;

/// Moves the job's stages from `from` to `to`. Every process of `group` calls it at the same
/// boundary with the same partitions and the same `round` (the job's count of moves), its
/// stages idle; `workers[r]` / `shards[r]` are null for the stages `placement` puts elsewhere.
/// Stages keep their processes; layers go with their stage. The report is the job's: layers and
/// bytes summed over the processes (bytes_sent: what crossed between processes), seconds this
/// process's. `timeout` bounds the exchange of the state (the engine gives it
/// cluster.connect_timeout). Errors (a stage of any process that cannot be built, a lost peer, a
/// message missing after `timeout`): every process returns an error naming the rank and nothing
/// changed anywhere; when a process is lost meanwhile, the others report that.
Expected<MoveReport> move_layers_across(ProcessGroup& group, const Placement& placement,
                                        const Partition& from, const Partition& to,
                                        std::vector<std::unique_ptr<StageWorker>>& workers,
                                        std::vector<std::unique_ptr<OptimizerShard>>& shards,
                                        uint32_t round, std::chrono::milliseconds timeout);

}  // namespace actorpipe
