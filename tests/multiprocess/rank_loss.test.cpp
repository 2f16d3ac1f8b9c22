// Losing a process: a rank killed mid-run makes the others stop within cluster.peer_timeout with
// an error naming it and where the stages stood; the latest checkpoint still loads and resumes
// to the bits of an uninterrupted run. A rank that cannot reach its coordinator gives up in time.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/files.hpp"
#include "tests/support/held_port.hpp"
#include "tests/support/temp_dir.hpp"

#ifndef ACTORPIPE_GPT
#error "ACTORPIPE_GPT names the actorpipe-gpt program"
#endif

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace actorpipe::testing;
using Clock = std::chrono::steady_clock;

const std::vector<std::string> kSmall = {
    "--set", "model.vocab_size=32",     "--set", "model.context=16",
    "--set", "model.width=32",          "--set", "model.heads=2",
    "--set", "model.depth=2",           "--set", "pipeline.microbatch_size=2",
    "--set", "pipeline.microbatches=4", "--set", "pipeline.mode=1f1b",
    "--set", "pipeline.stages=2",       "--set", "checkpoint.every=25",
    "--set", "train.log_every=0"};

// A child process running actorpipe-gpt; killed and reaped on destruction if still running.
class Child {
 public:
  Child(std::vector<std::string> args, const std::vector<std::string>& env_extra,
        const fs::path& output) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    env.insert(env.end(), env_extra.begin(), env_extra.end());
    args.insert(args.begin(), ACTORPIPE_GPT);
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    const int rc = posix_spawn(&pid_, ACTORPIPE_GPT, &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    REQUIRE_MESSAGE(rc == 0, "posix_spawn failed: " << rc);
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  void kill_now() { ::kill(pid_, SIGKILL); }
  /// The wait status once the child ended within `limit`, or nothing.
  std::optional<int> wait(std::chrono::duration<double> limit) {
    const auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return std::nullopt;
  }

 private:
  pid_t pid_ = -1;
};

std::vector<std::string> rank_args(int rank, int port, const fs::path& dir) {
  std::vector<std::string> a = kSmall;
  for (std::string s : {fmt::format("--rank={}", rank), std::string("--world=2"),
                        fmt::format("--coordinator=127.0.0.1:{}", port), std::string("--set"),
                        std::string("train.steps=100000"), std::string("--set"),
                        "checkpoint.dir=" + (dir / "ckpt").string(), std::string("--set"),
                        std::string("cluster.peer_timeout=5")})
    a.push_back(s);
  return a;
}

// Runs actorpipe-gpt in one process to completion; its output when it failed.
void run_one(std::vector<std::string> extra, const fs::path& dir) {
  std::vector<std::string> a = kSmall;
  a.insert(a.end(), extra.begin(), extra.end());
  Child c(a, {}, dir / "one.log");
  auto st = c.wait(std::chrono::seconds(120));
  REQUIRE_MESSAGE(st.has_value(), "a one-process run took over 120 s");
  REQUIRE_MESSAGE((WIFEXITED(*st) && WEXITSTATUS(*st) == 0), slurp(dir / "one.log"));
}

int latest_step(const fs::path& ckpt) {
  int best = -1;
  if (!fs::exists(ckpt)) return best;
  for (const auto& e : fs::directory_iterator(ckpt)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step-", 0) == 0 && n.find(".tmp") == std::string::npos &&
        fs::exists(e.path() / "manifest.json"))
      best = std::max(best, std::stoi(n.substr(5)));
  }
  return best;
}

}  // namespace

TEST_CASE("a killed rank stops the other within the peer timeout, the checkpoint resumes bitwise" *
          doctest::timeout(400)) {
  for (int victim : {1, 0}) {
    CAPTURE(victim);
    TempDir dir;
    const actorpipe::PortReservation held = held_port();
    const int port = held.port();
    const std::vector<std::string> env = {"ACTORPIPE_JOB_SECRET=0123456789abcdef0123456789abcdef"};
    Child r0(rank_args(0, port, dir.path), env, dir.path / "rank0.log");
    Child r1(rank_args(1, port, dir.path), env, dir.path / "rank1.log");
    Child* killed = victim == 0 ? &r0 : &r1;
    Child* other = victim == 0 ? &r1 : &r0;
    const fs::path other_log = dir.path / fmt::format("rank{}.log", 1 - victim);
    // a checkpoint first, then the kill mid-run
    const auto until = Clock::now() + std::chrono::seconds(120);
    while (latest_step(dir.path / "ckpt") < 50 && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    REQUIRE_MESSAGE(latest_step(dir.path / "ckpt") >= 50, slurp(other_log));
    // past the agreement that starts the next run, so that the kill usually lands mid-run
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    killed->kill_now();
    const auto t0 = Clock::now();
    const auto status = other->wait(std::chrono::seconds(20));
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    REQUIRE_MESSAGE(status.has_value(), "the surviving rank still runs 20 s after the kill");
    CHECK(took < 5.0 + 5.0);  // cluster.peer_timeout = 5, plus the stages' status requests
    CHECK((WIFEXITED(*status) && WEXITSTATUS(*status) == 1));
    const std::string out = slurp(other_log);
    CHECK_MESSAGE(out.find(fmt::format("rank {} was lost", victim)) != std::string::npos, out);
    // where the survivor's stage stood; or, when the kill fell between two runs (the test kills
    // right after a checkpoint, which ends a run), the agreement or the shared checkpoint write
    // it was in ("while writing the checkpoint of step N"); rank 0's driver may also have seen
    // its run through when rank 1 died before the run's end agreement ("stage 0 had finished")
    const bool between_runs = out.find("agreeing with the other ranks") != std::string::npos ||
                              out.find("while writing the checkpoint") != std::string::npos;
    if (victim == 1) {
      CHECK_MESSAGE((between_runs || out.find("stages at: stage 0 ") != std::string::npos ||
                     out.find("stage 0 had finished") != std::string::npos),
                    out);
    } else {
      CHECK_MESSAGE((between_runs || out.find("stage 1 ") != std::string::npos), out);
    }
    MESSAGE("rank " << 1 - victim << " stopped " << took << " s after rank " << victim
                    << " was killed: " << out.substr(out.rfind("error:")));

    // the latest checkpoint loads and continues exactly as an uninterrupted run
    const int k = latest_step(dir.path / "ckpt");
    const std::string steps = fmt::format("train.steps={}", k + 4);
    run_one({"--set", steps, "--set", "checkpoint.dir=" + (dir.path / "resumed").string(), "--set",
             "checkpoint.resume=" + (dir.path / "ckpt").string()},
            dir.path);
    run_one({"--set", steps, "--set", "checkpoint.dir=" + (dir.path / "straight").string()},
            dir.path);
    for (const char* f :
         {"model.safetensors", "optimizer.safetensors", "versions.safetensors", "manifest.json"}) {
      CHECK_MESSAGE(
          slurp(dir.path / "resumed" / "final" / f) == slurp(dir.path / "straight" / "final" / f),
          f);
    }
  }
}

TEST_CASE("a rank that cannot reach its coordinator gives up within cluster.connect_timeout" *
          doctest::timeout(60)) {
  TempDir dir;
  const actorpipe::PortReservation held = held_port();  // nobody listens there
  const int port = held.port();
  std::vector<std::string> a = rank_args(1, port, dir.path);
  a.insert(a.end(), {"--set", "cluster.connect_timeout=2"});
  Child r1(a, {"ACTORPIPE_JOB_SECRET=0123456789abcdef0123456789abcdef"}, dir.path / "rank1.log");
  const auto t0 = Clock::now();
  const auto status = r1.wait(std::chrono::seconds(30));
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  REQUIRE(status.has_value());
  CHECK((WIFEXITED(*status) && WEXITSTATUS(*status) == 1));
  CHECK(took < 15.0);
  const std::string out = slurp(dir.path / "rank1.log");
  CHECK_MESSAGE(out.find(fmt::format("127.0.0.1:{}", port)) != std::string::npos, out);
}

TEST_CASE("a killed replica stops the job, and its checkpoint resumes with any number of replicas" *
          doctest::timeout(400)) {
  // two replicas of a one-stage pipeline: rank 1 is replica 1
  TempDir dir;
  const actorpipe::PortReservation held = held_port();
  const int port = held.port();
  const std::vector<std::string> env = {"ACTORPIPE_JOB_SECRET=0123456789abcdef0123456789abcdef"};
  const std::vector<std::string> replicas = {"--set", "pipeline.stages=1", "--set",
                                             "pipeline.replicas=2"};
  auto args = [&](int rank) {
    std::vector<std::string> a = rank_args(rank, port, dir.path);
    a.insert(a.end(), replicas.begin(), replicas.end());
    return a;
  };
  Child r0(args(0), env, dir.path / "rank0.log");
  Child r1(args(1), env, dir.path / "rank1.log");
  const auto until = Clock::now() + std::chrono::seconds(120);
  while (latest_step(dir.path / "ckpt") < 50 && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE_MESSAGE(latest_step(dir.path / "ckpt") >= 50, slurp(dir.path / "rank0.log"));
  r1.kill_now();
  const auto t0 = Clock::now();
  const auto status = r0.wait(std::chrono::seconds(20));
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  REQUIRE_MESSAGE(status.has_value(), "replica 0 still runs 20 s after replica 1 was killed");
  CHECK(took < 5.0 + 5.0);
  CHECK((WIFEXITED(*status) && WEXITSTATUS(*status) == 1));
  const std::string out = slurp(dir.path / "rank0.log");
  CHECK_MESSAGE(out.find("rank 1 was lost") != std::string::npos, out);
  MESSAGE("replica 0 stopped " << took << " s after replica 1 was killed: "
                               << out.substr(out.rfind("error:")));

  // the checkpoint continues as an uninterrupted run of two replicas (the serial backend runs
  // both in one process), and loads into one replica, or into two pipelines of two stages
  const int k = latest_step(dir.path / "ckpt");
  const std::string steps = fmt::format("train.steps={}", k + 4);
  auto with = [&](std::vector<std::string> a, const std::string& out_dir) {
    a.insert(a.end(), {"--set", steps, "--set", "checkpoint.dir=" + (dir.path / out_dir).string()});
    return a;
  };
  const std::string resume = "checkpoint.resume=" + (dir.path / "ckpt").string();
  run_one(with({"--backend", "serial", "--set", "pipeline.stages=1", "--set", "pipeline.replicas=2",
                "--set", resume},
               "resumed"),
          dir.path);
  run_one(
      with({"--backend", "serial", "--set", "pipeline.stages=1", "--set", "pipeline.replicas=2"},
           "straight"),
      dir.path);
  for (const char* f :
       {"model.safetensors", "optimizer.safetensors", "versions.safetensors", "manifest.json"}) {
    CHECK_MESSAGE(
        slurp(dir.path / "resumed" / "final" / f) == slurp(dir.path / "straight" / "final" / f), f);
  }
  run_one(with({"--set", "pipeline.stages=1", "--set", "pipeline.replicas=1", "--set", resume},
               "one_replica"),
          dir.path);
  run_one(with({"--backend", "serial", "--set", "pipeline.stages=2", "--set", "pipeline.replicas=2",
                "--set", resume},
               "deeper"),
          dir.path);
  CHECK(fs::exists(dir.path / "one_replica" / "final" / "manifest.json"));
  CHECK(fs::exists(dir.path / "deeper" / "final" / "manifest.json"));
}
