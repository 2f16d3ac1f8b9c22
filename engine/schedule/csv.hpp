// CSV import/export in the compute-only format of torch.distributed.pipelining: one row per rank,
// one cell per time step ("0F0", "0B0"), empty cells for idle steps.
#pragma once

#include <string>
#include <string_view>

#include "engine/expected.hpp"
#include "engine/schedule/schedule.hpp"

namespace actorpipe {

/// The compute-only CSV: row r holds stage r's F and B actions, each in the column of its time
/// slot in the unit-cost replay of the compute-only schedule (so F of a microbatch at stage r+1
/// sits right of F at stage r, as torch's time-step runtime expects); idle slots are empty cells.
/// Versions, OPT_STEP, FLUSH and SEND/RECV are not part of the format and are left out.
/// Rows end with "\r\n" like Python's csv.writer and are padded to one length.
/// Errors: the schedule deadlocks (it has no time slots).
Expected<std::string> export_csv(const Schedule& schedule);

/// How an imported schedule is completed.
struct CsvImport {
  Mode mode = Mode::onef1b;  ///< recorded in the schedule (an import is one step)
  bool add_step_end = true;  ///< append OPT_STEP@1 and FLUSH to every stage, as the generators do
};

/// Reads the compute-only CSV (rows = ranks = stages; cells "<stage>F<mb>" or "<stage>B<mb>",
/// surrounding blanks ignored, empty cells skipped; "\n" or "\r\n" line ends). The result has one
/// step, microbatches = 1 + the largest microbatch seen, versions 0, and is validated.
/// Errors name the row, the column and the cell: a cell that does not parse, a kind other than
/// F or B, a stage that is not the row's (one stage per rank), a microbatch no smaller than the
/// number of actions in its row (it cannot have its F and B there), an empty file, or the
/// validator's diagnosis of the whole schedule.
Expected<Schedule> import_csv(std::string_view text, const CsvImport& options = {});

}  // namespace actorpipe
