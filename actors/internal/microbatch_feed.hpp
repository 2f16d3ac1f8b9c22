// Microbatch feed: the microbatches of a run as the stages of one process take them, read once
// from the process's own data loader in order and shared by its stages (the driver sends indices).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "engine/batch.hpp"
#include "engine/execution/replicated_executor.hpp"
#include "engine/expected.hpp"

namespace actorpipe {

class DataLoader;

namespace internal {

/// A microbatch shared read-only by the stages of one process.
using MicrobatchPtr = std::shared_ptr<const Microbatch>;

/// Run-local microbatch n is the loader's next microbatch after n others, whichever process
/// reads it (data loaders are pure functions of their position): so the driver only sends the
/// index and every process materialises the microbatches its own stages need. Each of the
/// process's `consumers` stages takes every microbatch once; the feed keeps one until all have.
/// Thread-safe (stages take from their own threads).
class MicrobatchFeed {
 public:
  /// `data` at the run's first microbatch; microbatches must be (B, T). With `split` of several
  /// replicas, run-local microbatch n is replica `replica`'s n-th: the loader's microbatch
  /// split.global_index(replica, n) of the run (it seeks there; the loader ends anywhere).
  MicrobatchFeed(DataLoader& data, int B, int T, int consumers, ReplicaSplit split = {},
                 int replica = 0);

  /// Run-local microbatch `mb`. Errors: the loader threw (naming the data position), a
  /// microbatch of another shape than (B, T) (naming it),
  /// `mb` already taken by every consumer or negative.
  Expected<MicrobatchPtr> take(int64_t mb);

  /// Microbatches read from the loader so far.
  int64_t read() const;

 private:
  struct Entry {
    MicrobatchPtr mb;
    int taken = 0;
  };
  DataLoader& data_;
  int B_, T_, consumers_;
  ReplicaSplit split_;
  int replica_ = 0;
  uint64_t start_ = 0;  // the loader's position at the run's start
  mutable std::mutex mu_;
  int64_t next_ = 0;  // run-local index of the loader's next microbatch
  std::map<int64_t, Entry> held_;
};

}  // namespace internal
}  // namespace actorpipe
