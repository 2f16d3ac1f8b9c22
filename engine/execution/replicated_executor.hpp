// ReplicatedExecutor: the serial reference of a data-parallel job (pipeline.replicas = w): w
// serial executors, one per replica, each on its own thread and its share of every step's
// microbatches, summing their gradients in replica order through a LocalReducer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/batch.hpp"
#include "engine/execution/gradient_reducer.hpp"
#include "engine/execution/serial_executor.hpp"
#include "engine/expected.hpp"
#include "engine/options.hpp"

namespace actorpipe {

class DataLoader;

/// Which of a step's m microbatches replica r of w runs: the contiguous block
/// [r·m/w, (r+1)·m/w) of the step (m divisible by w). The one definition of the split.
struct ReplicaSplit {
  int microbatches = 1;  ///< m per step, all replicas together
  int replicas = 1;      ///< w
  int per_replica() const { return microbatches / replicas; }
  /// The index, among the step's m microbatches, of replica r's j-th microbatch of the step.
  int step_index(int replica, int j) const { return replica * per_replica() + j; }
  /// The job's microbatch (counted from a run's first) that is replica r's n-th of the run:
  /// (n / (m/w))·m + r·(m/w) + n mod (m/w).
  int64_t global_index(int replica, int64_t n) const {
    const int64_t per = per_replica();
    return (n / per) * microbatches + step_index(replica, static_cast<int>(n % per));
  }
};

/// Replica r's microbatches of `steps` steps out of all of them (steps·m, in order): per step,
/// its ReplicaSplit block.
std::vector<Microbatch> replica_batches(std::span<const Microbatch> all, const ReplicaSplit& split,
                                        int replica);

/// Combines the replicas' losses of one step (each the mean over its share): (Σᵣ lossᵣ) / w,
/// summed in replica order in double.
double combine_replica_losses(std::span<const double> per_replica);

/// w SerialExecutors of one config, replica r's built with LocalReducer::member(r). A run reads
/// the step's m microbatches from one loader (its position is the job's: the same as with one
/// pipeline), hands each replica its ReplicaSplit block, and runs the w executors concurrently
/// (each one thread; they meet in the reducer at every update). Every replica ends with the
/// same weights and optimizer state, bit for bit.
class ReplicatedExecutor {
 public:
  /// Errors: as SerialExecutor::create(config), or pipeline.replicas < 1.
  static Expected<std::unique_ptr<ReplicatedExecutor>> create(const Config& config,
                                                              const Model* own_model = nullptr);

  int replicas() const { return static_cast<int>(replicas_.size()); }
  const ReplicaSplit& split() const { return split_; }
  SerialExecutor& replica(int r);
  const SerialExecutor& replica(int r) const;

  /// Runs `steps` optimizer steps on every replica over `batches` (steps·m microbatches, in the
  /// job's order). Returns each step's loss (combine_replica_losses). The first failure of any
  /// replica is the error (the others then fail in the reducer).
  Expected<std::vector<double>> run(int steps, std::span<const Microbatch> batches);
  /// As above, reading steps·m microbatches from `data`.
  Expected<std::vector<double>> run(int steps, DataLoader& data);

 private:
  ReplicatedExecutor() = default;
  ReplicaSplit split_;
  std::unique_ptr<LocalReducer> reducer_;
  std::vector<std::unique_ptr<SerialExecutor>> replicas_;
};

}  // namespace actorpipe
