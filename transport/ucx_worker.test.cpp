// UCX worker tests: messages that arrived for receives never posted are discarded when the worker
// shuts down, without UCX's warnings about each.
#include "transport/ucx_worker.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/output_capture.hpp"
#include "transport/tools/ucx_test_job.hpp"

namespace actorpipe {
namespace {

using namespace std::chrono_literals;

TEST_CASE("messages nobody received are discarded at shutdown, without UCX's warnings") {
  test::UcxTestJob job = test::connected_workers(2);
  // eager (64 B, 64 KiB) and rendezvous (3 MiB: above the 1 MiB threshold) messages to worker
  // 1, which posts no receive for them
  std::vector<std::vector<char>> payloads;
  for (size_t bytes : {size_t{64}, size_t{64} << 10, size_t{3} << 20})
    payloads.emplace_back(bytes, static_cast<char>(bytes & 0x7f));
  std::atomic<int> sent{0};
  for (size_t i = 0; i < payloads.size(); ++i)
    job.workers[0]->tag_send(job.peers[0].at(1), payloads[i].data(), payloads[i].size(), 0x5000 + i,
                             [&](Status, size_t) { ++sent; });
  // the eager ones have left worker 0 (the rendezvous one waits for a receive)
  for (int i = 0; i < 2000 && sent.load() < 2; ++i) std::this_thread::sleep_for(1ms);
  REQUIRE(sent.load() >= 2);
  std::this_thread::sleep_for(50ms);  // and reached worker 1's unexpected queue
  std::string out, err;
  {
    testing::OutputCapture capture_out(1);
    testing::OutputCapture capture_err(2);
    job.workers[1].reset();  // shutdown, then ucp_worker_destroy
    out = capture_out.text();
    err = capture_err.text();
  }
  MESSAGE(std::string(out + err));
  for (const std::string& text : {out, err}) {
    CHECK(text.find("was not matched") == std::string::npos);
    CHECK(text.find("was not returned to mpool") == std::string::npos);
  }
  job.workers[0].reset();
  CHECK(sent.load() == 3);  // the rendezvous send ended too: received and discarded, or failed
}

}  // namespace
}  // namespace actorpipe
