// UCX messenger tests: three workers of this process as the ranks of a job exchange thousands of
// small messages in order per sender, from several threads at once; streams stay apart; bad
// arguments and oversized messages are errors naming the cause; a closed messenger hands
// nothing on.
#include "transport/ucx_messenger.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/tools/ucx_test_job.hpp"
#include "transport/ucx_channel.hpp"

using namespace actorpipe;
using namespace std::chrono_literals;

namespace {

using test::why;

/// A message: sender, thread, index, then `extra` bytes of a pattern of the three.
std::vector<std::byte> make_message(int from, int thread, int index, size_t extra) {
  std::vector<std::byte> m(12 + extra);
  std::memcpy(m.data(), &from, 4);
  std::memcpy(m.data() + 4, &thread, 4);
  std::memcpy(m.data() + 8, &index, 4);
  for (size_t i = 0; i < extra; ++i)
    m[12 + i] =
        static_cast<std::byte>((from * 7 + thread * 13 + index + static_cast<int>(i)) & 0xFF);
  return m;
}

/// What one rank received: per (sender, thread), the indices in arrival order, and whether
/// every message's bytes were whole.
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::pair<int, int>, std::vector<int>> got;
  size_t count = 0;
  bool intact = true;
  std::vector<std::string> errors;

  UcxMessenger::Handler handler() {
    return [this](int from, std::span<const std::byte> m) {
      std::lock_guard<std::mutex> lock(mu);
      int sender = -1, thread = -1, index = -1;
      if (m.size() < 12) {
        intact = false;
      } else {
        std::memcpy(&sender, m.data(), 4);
        std::memcpy(&thread, m.data() + 4, 4);
        std::memcpy(&index, m.data() + 8, 4);
        const auto want = make_message(sender, thread, index, m.size() - 12);
        intact = intact && sender == from && std::equal(m.begin(), m.end(), want.begin());
      }
      got[{from, thread}].push_back(index);
      ++count;
      cv.notify_all();
    };
  }
  UcxMessenger::ErrorHandler error_handler() {
    return [this](int, const std::string& e) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(e);
      cv.notify_all();
    };
  }
  bool wait_for(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return count >= n; });
  }
};

}  // namespace

TEST_CASE("the tag: channel tag 0x7FFE, then stream, rank and sequence, which wraps at 2^20") {
  CHECK(ucx_messenger_tag(0, 0, 0) == ucx_tag(kUcxMessengerChannelTag, 0));
  CHECK(ucx_messenger_tag(1, 0, 0) != ucx_messenger_tag(2, 0, 0));
  CHECK(ucx_messenger_tag(1, 3, 5) != ucx_messenger_tag(1, 4, 5));
  CHECK(ucx_messenger_tag(1, 3, 5) == ucx_messenger_tag(1, 3, 5 + (1u << 20)));
  const uint64_t highest = ucx_messenger_tag(0xFFFF, kUcxMessengerMaxRanks - 1, (1u << 20) - 1);
  CHECK((highest >> 48) == kUcxMessengerChannelTag);
}

TEST_CASE(
    "three ranks, two sending threads each: every message arrives whole, in order per thread") {
  auto job = test::connected_workers(3);
  constexpr int kThreads = 2, kPerThread = 400;
  std::vector<std::unique_ptr<Inbox>> inbox;
  std::vector<std::unique_ptr<UcxMessenger>> m;
  for (int r = 0; r < 3; ++r) {
    inbox.push_back(std::make_unique<Inbox>());
    auto made = UcxMessenger::create(job.workers[static_cast<size_t>(r)], r,
                                     job.peers[static_cast<size_t>(r)], 7, inbox.back()->handler(),
                                     inbox.back()->error_handler());
    REQUIRE_MESSAGE(made.ok(), why(made));
    m.push_back(std::move(*made));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, r, t] {
        for (int i = 0; i < kPerThread; ++i) {
          const int to = (r + 1 + i % 2) % 3;  // both other ranks, alternating
          // sizes from 12 bytes to the limit
          const size_t extra = static_cast<size_t>(i * 37) % (m[0]->max_bytes() - 11);
          Status ok = m[static_cast<size_t>(r)]->send(to, make_message(r, t, i, extra));
          REQUIRE_MESSAGE(ok.ok(), ok.error().message);
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  const size_t each = kThreads * kPerThread;  // every rank gets half of each other rank's
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    REQUIRE(inbox[static_cast<size_t>(r)]->wait_for(each, 20s));
    Inbox& in = *inbox[static_cast<size_t>(r)];
    std::lock_guard<std::mutex> lock(in.mu);
    CHECK(in.intact);
    CHECK(in.errors.empty());
    CHECK(in.count == each);
    for (const auto& [key, indices] : in.got) {
      INFO("from rank " << key.first << ", thread " << key.second);
      CHECK(indices.size() == kPerThread / 2);
      CHECK(std::is_sorted(indices.begin(), indices.end()));
    }
    CHECK(m[static_cast<size_t>(r)]->delivered() == each);
  }
}

TEST_CASE("a message of another stream waits for a messenger of that stream") {
  auto job = test::connected_workers(2);
  Inbox at1_old, at1_new, at0;
  auto a =
      UcxMessenger::create(job.workers[0], 0, job.peers[0], 1, at0.handler(), at0.error_handler());
  REQUIRE_MESSAGE(a.ok(), why(a));
  {
    // rank 1 on stream 2 does not take stream 1's messages
    auto b = UcxMessenger::create(job.workers[1], 1, job.peers[1], 2, at1_old.handler(),
                                  at1_old.error_handler());
    REQUIRE_MESSAGE(b.ok(), why(b));
    for (int i = 0; i < 3; ++i) REQUIRE((*a)->send(1, make_message(0, 0, i, 4)).ok());
    CHECK_FALSE(at1_old.wait_for(1, 300ms));
  }
  // a messenger of stream 1 gets them, in order; the closed one got nothing
  auto b = UcxMessenger::create(job.workers[1], 1, job.peers[1], 1, at1_new.handler(),
                                at1_new.error_handler());
  REQUIRE_MESSAGE(b.ok(), why(b));
  REQUIRE(at1_new.wait_for(3, 10s));
  {
    std::lock_guard<std::mutex> lock(at1_new.mu);
    CHECK(at1_new.got[{0, 0}] == std::vector<int>{0, 1, 2});
    CHECK(at1_new.intact);
  }
  std::lock_guard<std::mutex> lock(at1_old.mu);
  CHECK(at1_old.count == 0);
}

TEST_CASE("bad arguments and oversized messages are errors naming the cause") {
  auto job = test::connected_workers(2);
  Inbox in;
  auto bad_rank = UcxMessenger::create(job.workers[0], kUcxMessengerMaxRanks, {}, 0, in.handler(),
                                       in.error_handler());
  REQUIRE_FALSE(bad_rank.ok());
  CHECK(bad_rank.error().message.find("rank 4096") != std::string::npos);
  auto bad_stream = UcxMessenger::create(job.workers[0], 0, job.peers[0], 0x10000, in.handler(),
                                         in.error_handler());
  REQUIRE_FALSE(bad_stream.ok());
  CHECK(bad_stream.error().message.find("stream 65536") != std::string::npos);
  auto self_peer =
      UcxMessenger::create(job.workers[0], 1, job.peers[1], 0, in.handler(), in.error_handler());
  // rank 1's peers hold rank 0: as rank 1 that is fine; as rank 0 it is its own rank
  REQUIRE(self_peer.ok());
  auto own =
      UcxMessenger::create(job.workers[0], 0, job.peers[1], 0, in.handler(), in.error_handler());
  REQUIRE_FALSE(own.ok());
  CHECK(own.error().message.find("peer rank 0") != std::string::npos);
  auto none = UcxMessenger::create(nullptr, 0, {}, 0, in.handler(), in.error_handler());
  REQUIRE_FALSE(none.ok());

  UcxMessengerOptions small;
  small.max_bytes = 16;
  auto m = UcxMessenger::create(job.workers[0], 0, job.peers[0], 3, in.handler(),
                                in.error_handler(), small);
  REQUIRE_MESSAGE(m.ok(), why(m));
  const Status big = (*m)->send(1, make_message(0, 0, 0, 5));
  REQUIRE_FALSE(big.ok());
  CHECK(big.error().message.find("17 bytes") != std::string::npos);
  CHECK((*m)->send(1, make_message(0, 0, 0, 4)).ok());
  const Status unknown = (*m)->send(5, make_message(0, 0, 0, 0));
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().message.find("no peer rank 5") != std::string::npos);
}
