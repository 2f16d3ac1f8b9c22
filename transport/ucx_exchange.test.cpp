// UCX exchange tests: three workers of this process swap buffers of every size (empty, a few
// bytes, megabytes) bit for bit in consecutive rounds; a missing peer, an oversized
// announcement and bad ranks are errors naming the cause.
#include "transport/ucx_exchange.hpp"

#include <doctest/doctest.h>

#include <future>
#include <string>
#include <thread>
#include <vector>

#include "transport/tools/ucx_test_job.hpp"
#include "transport/ucx_channel.hpp"

using namespace actorpipe;
using namespace std::chrono_literals;

namespace {

using test::why;

using Job = test::UcxTestJob;

Job connected(int n) {
  return test::connected_workers(n);
}

std::byte pattern(int from, int to, uint32_t round, size_t i) {
  return static_cast<std::byte>(
      (from * 131 + to * 31 + static_cast<int>(round) * 7 + static_cast<int>(i % 251)) & 0xFF);
}

}  // namespace

TEST_CASE("three ranks swap empty, small and large buffers bit for bit, round after round") {
  Job job = connected(3);
  // bytes from rank a to rank b: sizes of every kind, one empty pair
  auto size_of = [](int a, int b, uint32_t round) -> size_t {
    if (a == 0 && b == 2) return 0;
    if (a == 1 && b == 0) return 5;
    return static_cast<size_t>(round + 1) * (3u << 20) + static_cast<size_t>(a * 17 + b);
  };
  for (uint32_t round = 0; round < 3; ++round) {
    CAPTURE(round);
    std::vector<std::future<Expected<std::map<int, std::vector<std::byte>>>>> results;
    for (int r = 0; r < 3; ++r) {
      std::map<int, std::vector<std::byte>> out;
      for (int p = 0; p < 3; ++p) {
        if (p == r) continue;
        std::vector<std::byte> bytes(size_of(r, p, round));
        for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = pattern(r, p, round, i);
        if (!bytes.empty() || round == 1) out[p] = std::move(bytes);  // absent = empty
      }
      results.push_back(std::async(std::launch::async, [&, r, out = std::move(out)]() mutable {
        return ucx_exchange(*job.workers[static_cast<size_t>(r)], r,
                            job.peers[static_cast<size_t>(r)], round, std::move(out));
      }));
    }
    for (int r = 0; r < 3; ++r) {
      auto got = results[static_cast<size_t>(r)].get();
      REQUIRE_MESSAGE(got.ok(), why(got));
      CHECK(got->size() == 2);
      for (int p = 0; p < 3; ++p) {
        if (p == r) continue;
        const std::vector<std::byte>& bytes = got->at(p);
        REQUIRE(bytes.size() == size_of(p, r, round));
        bool same = true;
        for (size_t i = 0; i < bytes.size() && same; ++i)
          same = bytes[i] == pattern(p, r, round, i);
        CHECK_MESSAGE(same, "from rank " << p << " to rank " << r);
      }
    }
  }
}

TEST_CASE("a peer that never sends: an error naming it after the timeout") {
  Job job = connected(2);
  UcxExchangeOptions o;
  o.timeout = 200ms;
  const auto start = std::chrono::steady_clock::now();
  auto got = ucx_exchange(*job.workers[0], 0, job.peers[0], 4, {}, o);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE_FALSE(got.ok());
  CHECK(got.error().message.find("UCX exchange round 4 (rank 0): no length from rank(s) 1 "
                                 "within 200 ms") != std::string::npos);
  CHECK(waited < 5.0);
  // a round's messages match only that round: rank 1 answering round 5 does not satisfy 4's
}

TEST_CASE("an announced length above the limit is refused before any allocation") {
  Job job = connected(2);
  UcxExchangeOptions small;
  small.max_bytes = 1000;
  small.timeout = 5s;
  auto sender = std::async(std::launch::async, [&] {
    std::map<int, std::vector<std::byte>> out;
    out[0] = std::vector<std::byte>(4096);
    return ucx_exchange(*job.workers[1], 1, job.peers[1], 0, std::move(out), small);
  });
  auto got = ucx_exchange(*job.workers[0], 0, job.peers[0], 0, {}, small);
  REQUIRE_FALSE(got.ok());
  CHECK(got.error().message.find("rank 1 announced 4096 bytes, above the limit of 1000") !=
        std::string::npos);
  sender.wait_for(10s);
}

TEST_CASE("bad ranks, rounds and destinations are errors") {
  Job job = connected(2);
  CHECK(why(ucx_exchange(*job.workers[0], -1, job.peers[0], 0, {})).find("rank -1") !=
        std::string::npos);
  CHECK(why(ucx_exchange(*job.workers[0], 0, job.peers[0], 0x80000000u, {})).find("round") !=
        std::string::npos);
  std::map<int, UcxEndpoint> self = {{0, job.peers[0].at(1)}};
  CHECK(why(ucx_exchange(*job.workers[0], 0, self, 0, {})).find("peer rank 0") !=
        std::string::npos);
  std::map<int, std::vector<std::byte>> stray;
  stray[7] = std::vector<std::byte>(3);
  CHECK(why(ucx_exchange(*job.workers[0], 0, job.peers[0], 0, std::move(stray)))
            .find("3 bytes for rank 7, which is not a peer") != std::string::npos);
  // tags: the exchange's own channel tag, the round, kind and sender in the sequence
  const uint64_t channel = ucx_exchange_tag(3, true, 5) >> kUcxSequenceBits;
  CHECK(channel == kUcxExchangeChannelTag);
  const uint64_t seq = ucx_exchange_tag(3, true, 5) & kUcxMaxSequence;
  CHECK(seq == ((uint64_t{3} << 17) | (uint64_t{1} << 16) | 5u));
  CHECK(ucx_exchange_tag(3, false, 5) != ucx_exchange_tag(3, true, 5));
  CHECK(ucx_exchange_tag(3, false, 5) != ucx_exchange_tag(4, false, 5));
}
