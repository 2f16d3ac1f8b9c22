// Peer process tests: the thread environment, the command line's order, and how a run's output
// becomes an answer (a stand-in peer written in sh, so that no Python is needed).
#include "bench/peer_process.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "kernels/blas_core.hpp"

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {

using Env = std::vector<std::pair<std::string, std::string>>;

// A shell script that prints `out` and exits with `status`; removed with the object.
struct FakePeer {
  std::string path;
  FakePeer(const std::string& out, int status) {
    char name[] = "/tmp/actorpipe_peer_process_XXXXXX";
    const int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    close(fd);
    path = name;
    std::ofstream(path) << "cat <<'EOF'\n" << out << "EOF\nexit " << status << "\n";
  }
  ~FakePeer() { std::remove(path.c_str()); }
  PeerStatus run(nlohmann::json* answer = nullptr) const { return run_with("/bin/sh", answer); }
  PeerStatus run_with(const std::string& interpreter, nlohmann::json* answer = nullptr) const {
    PeerStatus status;
    run_peer({interpreter, path}, 2, status, [&](const nlohmann::json& j) {
      if (answer) *answer = j;
    });
    return status;
  }
};

}  // namespace

TEST_CASE("peer_environment: thread counts, and passive waiting from 2 threads on") {
  CHECK(peer_environment(1, "") == Env{{"OMP_NUM_THREADS", "1"}, {"OPENBLAS_NUM_THREADS", "1"}});
  CHECK(peer_environment(2, "") == Env{{"OMP_NUM_THREADS", "2"},
                                       {"OPENBLAS_NUM_THREADS", "2"},
                                       {"OMP_WAIT_POLICY", "PASSIVE"},
                                       {"OPENBLAS_THREAD_TIMEOUT", "4"}});
}

TEST_CASE("peer_environment: the OpenBLAS core this process switched to goes to the peer too") {
  CHECK(peer_environment(1, "SkylakeX") == Env{{"OMP_NUM_THREADS", "1"},
                                               {"OPENBLAS_NUM_THREADS", "1"},
                                               {"OPENBLAS_CORETYPE", "SkylakeX"}});
  // this process: a core only where it switched one (use_fitting_blas_core)
  const BlasCore core = blas_core();
  CHECK(peer_blas_core() == (core.picked_at_load.empty() || std::getenv("OPENBLAS_CORETYPE")
                                 ? std::string()
                                 : core.name));
}

TEST_CASE("peer_argv: the shape, the extra arguments, then the run and the optimizer") {
  const BenchShape tiny = find_bench_shape("tiny").value();
  CHECK(peer_argv("py", "peer.py", tiny, {"--chunks=4"}, OptimizerOptions{}, 2, 5, 1) ==
        std::vector<std::string>{"py", "peer.py", "--vocab=256", "--context=128", "--width=128",
                                 "--depth=4", "--heads=4", "--batch=8", "--seq=128", "--chunks=4",
                                 "--threads=2", "--reps=5", "--warmup=1", "--lr=0.001",
                                 "--beta1=0.9", "--beta2=0.95", "--eps=1e-08", "--weight-decay=0",
                                 "--grad-clip=1"});
  CHECK(peer_argv("py", "peer.py", tiny, {}, OptimizerOptions{}, 1, 1, 1).size() == 18);
}

TEST_CASE("run_peer: the last JSON object line is the answer") {
  const FakePeer peer("starting\n{\"ok\": false}\n[1, 2]\n{\"ok\": true, \"x\": 7}\nbye\n", 0);
  nlohmann::json answer;
  const PeerStatus r = peer.run(&answer);
  CHECK(r.ran);
  CHECK_FALSE(r.missing);
  CHECK(r.error.empty());
  CHECK(answer.at("x").get<int>() == 7);
}

TEST_CASE("run_peer: an answer without the fields read is unexpected output") {
  const FakePeer peer("{\"ok\": true}\n", 0);
  PeerStatus status;
  run_peer({"/bin/sh", peer.path}, 1, status,
           [](const nlohmann::json& j) { (void)j.at("tokens_per_s").get<double>(); });
  CHECK_FALSE(status.ran);
  CHECK_FALSE(status.missing);
  CHECK(status.error.rfind("unexpected peer output: ", 0) == 0);
}

TEST_CASE("run_peer: a failure the peer reports, missing or not") {
  const FakePeer missing(R"({"ok": false, "missing": true, "error": "no torch"})"
                         "\n",
                         3);
  PeerStatus r = missing.run();
  CHECK_FALSE(r.ran);
  CHECK(r.missing);
  CHECK(r.error == "no torch");
  const FakePeer failed("{\"ok\": false}\n", 1);
  r = failed.run();
  CHECK_FALSE(r.ran);
  CHECK_FALSE(r.missing);
  CHECK(r.error == "the peer reported a failure");
}

TEST_CASE("run_peer: no answer, an absent interpreter or an absent script") {
  const FakePeer silent("not json\n", 5);
  PeerStatus r = silent.run();
  CHECK_FALSE(r.ran);
  CHECK_FALSE(r.missing);
  CHECK(r.error == "the peer exited with status 5 without a result");
  r = silent.run_with("/nonexistent/python3");
  CHECK_FALSE(r.ran);
  CHECK(r.missing);
  r = PeerStatus{};
  run_peer({"/bin/sh", "/nonexistent/peer.py"}, 1, r, [](const nlohmann::json&) {});
  CHECK_FALSE(r.ran);
  CHECK(r.missing);
  CHECK(r.error == "peer script /nonexistent/peer.py not found (use --peer-script)");
}
