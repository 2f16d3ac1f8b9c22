// Fuzzes the schedule CSV import (import_csv: rows of cells like 0F3, blanks, quotes, CR LF,
// then the validator on the whole schedule). An imported schedule exports (export_csv) as a CSV
// that imports as the same schedule; anything else is an error.
#include "engine/schedule/csv.hpp"
#include "engine/schedule/validate.hpp"
#include "tests/fuzz/fuzz_support.hpp"

using namespace actorpipe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto schedule = import_csv(fuzz::as_text(data, size));
  if (!schedule) {
    FUZZ_CHECK(!schedule.error().message.empty(), "an error without a message");
    return 0;
  }
  FUZZ_CHECK(validate(*schedule).ok(), "an imported schedule does not validate");
  auto csv = export_csv(*schedule);
  FUZZ_CHECK(csv.ok(), "an imported schedule does not export: {}", csv.error().message);
  auto again = import_csv(*csv);
  FUZZ_CHECK(again.ok(), "the export of an imported schedule does not import: {}\n{}",
             again.ok() ? "" : again.error().message, *csv);
  FUZZ_CHECK(*again == *schedule, "the export of an imported schedule imports differently:\n{}",
             *csv);
  (void)format_grid(*schedule, GridOptions{.versions = true});
  return 0;
}
