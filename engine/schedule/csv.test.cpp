// Tests of the torch.distributed.pipelining compute-only CSV: exact export of a small schedule,
// round-trips in both directions, and the errors of a bad import.
#include "engine/schedule/csv.hpp"

#include <doctest/doctest.h>

#include <string>

#include "engine/schedule/generators.hpp"
#include "engine/schedule/lowering.hpp"

using namespace actorpipe;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("export of gpipe d=2 m=2 is time-aligned with empty idle cells") {
  auto s = make_gpipe(2, 2);
  REQUIRE(s.ok());
  auto csv = export_csv(*s);
  REQUIRE(csv.ok());
  CHECK(*csv ==
        "0F0,0F1,,,0B0,0B1\r\n"
        ",1F0,1F1,1B0,1B1,\r\n");
  // Lowering does not change the compute-only CSV.
  auto l = lower(*s);
  REQUIRE(l.ok());
  CHECK(*export_csv(*l) == *csv);
}

TEST_CASE("synchronous schedules round-trip exactly") {
  for (int d = 1; d <= 8; ++d) {
    for (int m = 1; m <= 16; m += 3) {
      for (auto s : {make_gpipe(d, m), make_1f1b(d, m)}) {
        REQUIRE(s.ok());
        auto csv = export_csv(*s);
        REQUIRE(csv.ok());
        CsvImport opts;
        opts.mode = s->mode;
        auto back = import_csv(*csv, opts);
        REQUIRE_MESSAGE(back.ok(), back.error().message);
        CHECK(*back == *s);
        CHECK(*export_csv(*back) == *csv);
      }
    }
  }
}

TEST_CASE("asynchronous schedules keep their compute order through the CSV") {
  for (auto s : {make_2bw(4, 4, 3), make_pipedream(4, 9), make_xpipe(3, 2, 4)}) {
    REQUIRE(s.ok());
    auto csv = export_csv(*s);
    REQUIRE(csv.ok());
    CsvImport opts;
    opts.add_step_end = false;
    auto back = import_csv(*csv, opts);
    REQUIRE(back.ok());
    CHECK(back->total_microbatches() == s->total_microbatches());
    for (int r = 0; r < s->stages; ++r) {
      std::vector<Action> want;
      for (Action a : s->per_stage[r]) {
        if (!is_compute(a.kind)) continue;
        a.version = a.lookahead = 0;
        want.push_back(a);
      }
      CHECK(back->per_stage[r] == want);
    }
  }
}

TEST_CASE("import accepts blanks, quotes, LF line ends and ragged rows") {
  const std::string text =
      " 0F0 , 0F1,\"\",, 0B0,0B1\n"
      ",1F0,1F1,1B0,1B1\n"
      "\n";
  auto s = import_csv(text);
  REQUIRE_MESSAGE(s.ok(), s.error().message);
  CHECK(s->mode == Mode::onef1b);
  CHECK(s->stages == 2);
  CHECK(s->microbatches == 2);
  CHECK(s->steps == 1);
  auto want = make_gpipe(2, 2);
  REQUIRE(want.ok());
  CHECK(s->per_stage == want->per_stage);
}

TEST_CASE("import errors name the row, the column and the cell") {
  auto bad = import_csv("0F0,0B0\n1F0,1X0\n");
  REQUIRE_FALSE(bad.ok());
  CHECK(contains(bad.error().message, "CSV row 1 column 1: cell '1X0' is not an action"));

  auto comm = import_csv("0F0,0SEND_F0,0B0\n");
  REQUIRE_FALSE(comm.ok());
  CHECK(contains(comm.error().message, "cell '0SEND_F0' is not allowed"));
  CHECK(contains(comm.error().message, "F and B cells"));

  auto versioned = import_csv("0F0@1,0B0\n");
  REQUIRE_FALSE(versioned.ok());
  CHECK(contains(versioned.error().message, "cell '0F0@1' is not allowed"));

  auto stage = import_csv("0F0,0B0\n,0F0\n");
  REQUIRE_FALSE(stage.ok());
  CHECK(contains(stage.error().message, "CSV row 1 column 1: cell '0F0' names stage 0"));

  auto empty = import_csv("\r\n,,\r\n");
  REQUIRE_FALSE(empty.ok());
  CHECK(contains(empty.error().message, "CSV has no actions"));
}

TEST_CASE("a microbatch beyond what its row can hold is refused before validation") {
  // The validator keeps tables per microbatch: 999999999 of them would take gigabytes.
  auto huge = import_csv("0F999999999,0B999999999\n");
  REQUIRE_FALSE(huge.ok());
  CHECK(contains(huge.error().message,
                 "CSV row 0 column 0: cell '0F999999999' names microbatch 999999999, but row 0 "
                 "holds only 2 actions"));
  auto second_row = import_csv("0F0,0B0\n1F0,,1B70000\n");
  REQUIRE_FALSE(second_row.ok());
  CHECK(contains(second_row.error().message,
                 "CSV row 1 column 2: cell '1B70000' names microbatch 70000"));
}

TEST_CASE("an imported schedule is validated") {
  // Stage 1 never runs the backward of microbatch 1.
  auto s = import_csv("0F0,0F1,,,0B0,0B1\r\n,1F0,1F1,1B0,,\r\n");
  REQUIRE_FALSE(s.ok());
  const std::string& msg = s.error().message;
  CHECK(contains(msg, "imported CSV: invalid 1f1b schedule"));
  CHECK(contains(msg, "B of microbatch 1 is missing (its F is here)"));
  CHECK(contains(msg, "[1F1]"));
  CHECK(contains(msg, "<-- ERROR HERE"));
}
