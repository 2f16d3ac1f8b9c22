// Layer move: the stages of one process take a new partition between two runs of the pipeline —
// every stage whose layer range changes gets a new worker and optimizer shard holding exactly
// what the old stages held for those layers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/expected.hpp"
#include "engine/model/model.hpp"
#include "engine/model/partition.hpp"

namespace actorpipe {

class OptimizerShard;
class StageWorker;

/// What a move did.
struct MoveReport {
  std::vector<int> from;  ///< layers per stage before
  std::vector<int> to;    ///< and after
  int layers_moved = 0;   ///< layers that changed stage
  /// Bytes of the moved layers' state: newest parameters, optimizer state, older live weight
  /// versions (2bw's previous one); what crosses a stage boundary.
  int64_t bytes_moved = 0;
  /// Bytes copied in all: the moved layers' and those of the layers that stay on a stage that
  /// is rebuilt (one process: a rebuilt stage copies its remaining layers into its new buffers).
  int64_t bytes_copied = 0;
  std::vector<int> stages_rebuilt;  ///< stages with a new worker and shard
  double seconds = 0.0;             ///< wall time of the move
};

/// Moves the stages `workers` / `shards` (one per stage, all of this process, idle: no
/// microbatch in flight, no update open, all at the same update count) from partition `from` to
/// `to` (the same stages and layers). A stage keeping its range keeps its worker and shard
/// (StageWorker::repartition); every other stage gets new ones built with its old options,
/// into which the old stages' state is copied by layer: newest parameters, optimizer state
/// (moments, the update count), every older live weight version (2bw's previous version, so a
/// continued run goes on exactly), tied copies as their holders held them. Gradient buffers and
/// activation stashes are empty between runs and are sized anew. On an error nothing is
/// changed: the old workers and shards stay in place.
Expected<MoveReport> move_layers(const Partition& from, const Partition& to,
                                 std::vector<std::unique_ptr<StageWorker>>& workers,
                                 std::vector<std::unique_ptr<OptimizerShard>>& shards);

}  // namespace actorpipe
