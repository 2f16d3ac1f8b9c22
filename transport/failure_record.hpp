// Failure record: what a process of a job leaves behind when it ends with a failure of its own,
// for the process that a launcher starts in its place (actorpipe-launch --max-restarts). The
// next process compares its own failure with it: the same failure again, no step further on,
// would come again at every restart, so it tells the launcher not to restart it (kExitNoRestart).
#pragma once

#include <optional>
#include <string>

#include "engine/expected.hpp"

namespace actorpipe {

/// A rank's last failure of its own (not the loss of another rank).
struct FailureRecord {
  std::string error;  ///< the failure's message, as the process printed it
  long step = -1;     ///< the step the training had reached; -1: before any
  int restart = 0;    ///< the restart that followed it (1: the first)

  bool operator==(const FailureRecord&) const = default;
};

/// Reads the record at `path`: none when no file is there; an error naming the file when it
/// cannot be read or is not a record.
Expected<std::optional<FailureRecord>> read_failure_record(const std::string& path);

/// Writes `record` to `path` whole or not at all (a file beside it, then renamed over it); an
/// error naming the file when it cannot.
Status write_failure_record(const std::string& path, const FailureRecord& record);

}  // namespace actorpipe
