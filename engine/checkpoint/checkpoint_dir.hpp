// The checkpoint directory of a run: held by one run at a time (a lock file), checked before
// training starts (writable, room for a checkpoint, no other run's checkpoints in the way).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/checkpoint/checkpoint.hpp"
#include "engine/expected.hpp"

namespace actorpipe {

/// The name of the lock file inside a checkpoint directory.
inline constexpr const char* kCheckpointLockFile = "lock";

/// A run's hold on its checkpoint directory: an exclusive flock(2) on <dir>/lock, whose text
/// names the holder ("pid 1234 on host h since 2026-11-25T22:10:00Z"). Released when this object
/// is destroyed or its process ends in any way (kill -9 included), so a resume after a crash
/// finds the directory free.
class CheckpointDirLock {
 public:
  CheckpointDirLock() = default;
  ~CheckpointDirLock();
  CheckpointDirLock(CheckpointDirLock&& other) noexcept;
  CheckpointDirLock& operator=(CheckpointDirLock&& other) noexcept;
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

  /// Takes the lock of `dir` (created if missing). Errors: another holder (named by its lock
  /// text), a directory that cannot be created or a lock file that cannot be opened.
  static Expected<CheckpointDirLock> acquire(const std::string& dir);

  bool held() const { return fd_ >= 0; }
  const std::string& dir() const { return dir_; }

 private:
  int fd_ = -1;
  std::string dir_;
};

/// What a run is about to do with its checkpoint directory.
struct CheckpointDirPlan {
  std::string dir;                ///< checkpoint.dir
  bool resuming_here = false;     ///< the run resumes from a checkpoint inside `dir` (or `dir`)
  bool overwrite = false;         ///< checkpoint.overwrite: remove another run's checkpoints
  uint64_t checkpoint_bytes = 0;  ///< the tensor bytes of one checkpoint of this run
};

/// Everything that would fail at the first checkpoint fails here instead, before training:
/// creates `dir`, takes its lock (a second run is refused naming the holder), writes and
/// removes a test file, and checks that the file system has room for one checkpoint. A fresh
/// run (not resuming from `dir`) into a directory that holds checkpoints is refused, naming
/// them, unless `overwrite`: then they are removed, so that a later resume from `dir` cannot
/// pick one of them. Every error names checkpoint.dir and the reason.
Expected<CheckpointDirLock> prepare_checkpoint_dir(const CheckpointDirPlan& plan);

}  // namespace actorpipe
