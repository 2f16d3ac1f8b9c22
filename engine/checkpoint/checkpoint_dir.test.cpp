// Checkpoint directory tests: one run holds the lock at a time and the refusal names the
// holder; the lock goes with its process (also one killed); a fresh run is refused where another
// run's checkpoints lie, unless it resumes from them or overwrites them; the space check.
#include "engine/checkpoint/checkpoint_dir.hpp"

#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/forked_child.hpp"
#include "tests/support/temp_dir.hpp"

using namespace actorpipe;
using actorpipe::testing::Child;
using actorpipe::testing::Pipe;
using actorpipe::testing::TempDir;
namespace fs = std::filesystem;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

void make_checkpoint(const fs::path& dir, const std::string& name) {
  fs::create_directories(dir / name);
  std::ofstream(dir / name / "manifest.json") << "{}";
}

}  // namespace

TEST_CASE("one run at a time holds a checkpoint directory, the refusal names the holder") {
  TempDir tmp;
  const std::string dir = (tmp.path / "ckpt").string();
  {
    auto first = CheckpointDirLock::acquire(dir);  // creates the directory
    REQUIRE_MESSAGE(first, first.error().message);
    CHECK(first->held());
    auto second = CheckpointDirLock::acquire(dir);
    REQUIRE(!second);
    MESSAGE(second.error().message);
    CHECK(contains(second.error().message, "checkpoint.dir = \"" + dir + "\" is in use"));
    CHECK(contains(second.error().message, "pid " + std::to_string(::getpid()) + " on host"));
    auto moved = std::move(*first);  // the hold moves with the object
    CHECK(!CheckpointDirLock::acquire(dir));
  }
  CHECK(CheckpointDirLock::acquire(dir));  // released with its holder
}

TEST_CASE("the lock of a process that is killed is free again") {
  TempDir tmp;
  const std::string dir = (tmp.path / "ckpt").string();
  Pipe from_child, to_child;
  Child child([&] {
    auto lock = CheckpointDirLock::acquire(dir);
    from_child.write_line(lock ? "locked" : "error " + lock.error().message);
    static_cast<void>(to_child.read_line(std::chrono::seconds(60)));
    return 0;
  });
  REQUIRE(from_child.read_line(std::chrono::seconds(30)) == "locked");
  auto refused = CheckpointDirLock::acquire(dir);
  REQUIRE(!refused);
  CHECK(!contains(refused.error().message, "pid " + std::to_string(::getpid()) + " "));
  child.kill9();
  REQUIRE(child.wait(std::chrono::seconds(30)));
  auto after = CheckpointDirLock::acquire(dir);
  CHECK_MESSAGE(after, after.error().message);
}

TEST_CASE("a fresh run refuses another run's checkpoints unless it resumes or overwrites") {
  TempDir tmp;
  const fs::path dir = tmp.path / "ckpt";
  CheckpointDirPlan plan;
  plan.dir = dir.string();
  {  // an empty or missing directory: ready, nothing left behind but the lock file
    auto ok = prepare_checkpoint_dir(plan);
    REQUIRE_MESSAGE(ok, ok.error().message);
    CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);
    CHECK(fs::exists(dir / kCheckpointLockFile));
  }
  make_checkpoint(dir, "step-5");
  make_checkpoint(dir, "final");
  fs::create_directories(dir / "step-9.tmp-1-0");  // a temporary: not a checkpoint
  std::ofstream(dir / "notes.txt") << "mine";
  CHECK(checkpoints_in(dir.string()) == std::vector<std::string>{"final", "step-5"});
  {
    auto refused = prepare_checkpoint_dir(plan);
    REQUIRE(!refused);
    MESSAGE(refused.error().message);
    CHECK(contains(refused.error().message, "holds checkpoints of another run (final, step-5)"));
    CHECK(contains(refused.error().message, "checkpoint.overwrite = true"));
    CHECK(fs::exists(dir / "step-5"));
  }
  {
    plan.resuming_here = true;
    auto ok = prepare_checkpoint_dir(plan);
    REQUIRE_MESSAGE(ok, ok.error().message);
    CHECK(checkpoints_in(dir.string()).size() == 2);
    plan.resuming_here = false;
  }
  {
    plan.overwrite = true;
    auto ok = prepare_checkpoint_dir(plan);
    REQUIRE_MESSAGE(ok, ok.error().message);
    CHECK(checkpoints_in(dir.string()).empty());
    CHECK(fs::exists(dir / "notes.txt"));  // only checkpoints are removed
  }
}

TEST_CASE("a directory that cannot be made or lacks room is refused before training") {
  TempDir tmp;
  std::ofstream(tmp.path / "file") << "x";
  CheckpointDirPlan plan;
  plan.dir = (tmp.path / "file" / "ckpt").string();
  auto bad = prepare_checkpoint_dir(plan);
  REQUIRE(!bad);
  MESSAGE(bad.error().message);
  CHECK(contains(bad.error().message, "checkpoint.dir = \"" + plan.dir + "\": cannot create it"));
  plan.dir = (tmp.path / "ckpt").string();
  plan.checkpoint_bytes = uint64_t{1} << 62;
  auto full = prepare_checkpoint_dir(plan);
  REQUIRE(!full);
  MESSAGE(full.error().message);
  CHECK(contains(full.error().message, "free on its file system, a checkpoint of this run needs"));
  plan.checkpoint_bytes = 1024;
  CHECK(prepare_checkpoint_dir(plan));
}
