// Layer move: the stages take a new partition between two runs of the pipeline — every stage
// whose layer range changes gets a new worker and optimizer shard holding exactly what the old
// stages held for those layers. In one process move_layers does it all; across processes the
// same three phases run in every process (rebuilt_state, build_rebuilt_stages,
// install_rebuilt_stages) with the state carried between them (actors/process_move.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/checkpoint/checkpoint.hpp"
#include "engine/execution/scratch_pool.hpp"
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
  /// is rebuilt (a rebuilt stage copies its remaining layers into its new buffers).
  int64_t bytes_copied = 0;
  /// Of bytes_moved, what crossed from one process to another (0 in one process).
  int64_t bytes_sent = 0;
  /// Bytes of scratch buffers (activation stashes, backward and recompute scratch) the rebuilt
  /// stages of this process took over from the stages they replaced instead of allocating.
  int64_t bytes_reused = 0;
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

/// The stages whose layer range differs between `from` and `to`, in order. Errors: partitions
/// of different stage or layer counts.
Expected<std::vector<int>> rebuilt_stages(const Partition& from, const Partition& to);

/// The global layer a checkpoint tensor name ("layers.<i>.<slot>...") belongs to, or -1.
int checkpoint_layer(const std::string& name);

/// Phase 1: copies of what this process's stages that the move rebuilds hold, under the
/// checkpoint's layer-granular names (pipeline_checkpoint_refs), with info.model,
/// info.optimizer and extra "updates" from them. `workers[r]` / `shards[r]` are null for the
/// stages of other processes; `from` and `to` cover every stage. No tensor when no local stage
/// is rebuilt. Errors: sizes that do not match, stages not idle or at different update counts.
Expected<CheckpointContents> rebuilt_state(const Partition& from, const Partition& to,
                                           std::span<const std::unique_ptr<StageWorker>> workers,
                                           std::span<const std::unique_ptr<OptimizerShard>> shards);

/// This process's stages that a move rebuilds, built for the new partition and loaded, not yet
/// in place. Their scratch buffers are those of the stages they replace (`lenders`, which gave
/// them: StageWorker::give_scratch) where those fit. Dropped without install_rebuilt_stages
/// (this or another process failed), they hand the buffers back: the old stages run on exactly
/// as before.
struct RebuiltStages {
  std::vector<int> stages;
  std::vector<std::unique_ptr<StageWorker>> workers;
  std::vector<std::unique_ptr<OptimizerShard>> shards;
  std::vector<StageWorker*> lenders;  ///< the stages replaced; empty once installed
  ScratchPool scratch;                ///< the lenders' buffers not taken

  RebuiltStages() = default;
  RebuiltStages(RebuiltStages&& other) noexcept;
  RebuiltStages& operator=(RebuiltStages&& other) noexcept;
  ~RebuiltStages();
};

/// Phase 2: builds every local stage that the move rebuilds (with its old worker's options and
/// the old stages' scratch buffers) and loads it from `state`, which must hold every tensor those
/// stages need under `to` (load_pipeline_checkpoint; in 2bw a rebuilt tied copy whose owner's
/// previous version is not in `state` takes its own, which holds the same value). Nothing in place
/// changes but the old stages' scratch, lent until the result is installed or dropped. Errors (the
/// scratch handed back): a tensor missing or of another shape, naming it.
Expected<RebuiltStages> build_rebuilt_stages(
    const Partition& from, const Partition& to, CheckpointContents state,
    std::span<const std::unique_ptr<StageWorker>> workers,
    std::span<const std::unique_ptr<OptimizerShard>> shards);

/// Phase 3 (cannot fail): the rebuilt stages take their places, and every local stage that
/// keeps its range learns the new partition.
void install_rebuilt_stages(RebuiltStages rebuilt, const Partition& to,
                            std::vector<std::unique_ptr<StageWorker>>& workers,
                            std::vector<std::unique_ptr<OptimizerShard>>& shards);

}  // namespace actorpipe
