// Failure record tests: written and read back whole, none where no file is, a malformed or
// unreadable one refused by name.
#include "transport/failure_record.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "tests/support/temp_dir.hpp"

using namespace actorpipe;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

}  // namespace

TEST_CASE("a failure record is read back as written, a second replacing the first") {
  testing::TempDir dir;
  const std::string path = dir.file("rank-1");
  auto none = read_failure_record(path);
  REQUIRE(none.ok());
  CHECK_FALSE(none->has_value());

  FailureRecord r{"rank 1: loss is nan at step 12\n(second line: 3 ranks)", 12, 2};
  REQUIRE(write_failure_record(path, r).ok());
  auto back = read_failure_record(path);
  REQUIRE(back.ok());
  REQUIRE(back->has_value());
  CHECK(**back == r);

  FailureRecord before_any{"a job of 3 processes for a pipeline of 2 stages", -1, 1};
  REQUIRE(write_failure_record(path, before_any).ok());
  back = read_failure_record(path);
  REQUIRE(back.ok());
  CHECK(**back == before_any);
  CHECK_FALSE(std::filesystem::exists(path + ".part"));
}

TEST_CASE("a file that is not a failure record, or cannot be read or written, is named") {
  testing::TempDir dir;
  for (const char* text :
       {"", "something else\nstep 1\nrestart 1\n",
        "actorpipe failure record 1\nstep x\nrestart 1\n", "actorpipe failure record 1\nstep 3\n",
        "actorpipe failure record 1\nstep -2\nrestart 1\nerror",
        "actorpipe failure record 1\nstep 3\nrestart -1\nerror"}) {
    CAPTURE(text);
    const std::string path = dir.file("bad");
    write_text(path, text);
    auto r = read_failure_record(path);
    REQUIRE_FALSE(r.ok());
    CHECK(contains(r.error().message, "failure record " + path + ": not a failure record"));
  }
  // a directory where the record should be
  auto r = read_failure_record(dir.str());
  REQUIRE_FALSE(r.ok());
  CHECK(contains(r.error().message, "failure record " + dir.str() + ": cannot be read"));
  // in a directory that does not exist
  const std::string missing = dir.file("no/such/dir/rank-0");
  Status w = write_failure_record(missing, FailureRecord{"x", 1, 1});
  REQUIRE_FALSE(w.ok());
  CHECK(contains(w.error().message, "failure record " + missing + ": cannot be written"));
}
