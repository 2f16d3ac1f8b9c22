// Local channel tests: zero-copy hand-off, sequence numbers, the fixed channel order (full and
// partial sets), errors for foreign or mismatching announcements, a concurrent sender/receiver.
#include "transport/local_channel.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "kernels/check.hpp"

using namespace actorpipe;

TEST_CASE("post then receive hands over the same storage, no copy") {
  LocalChannel ch(channel_ends(1, Direction::forward));
  Tensor t = Tensor::zeros({2, 3, 4});
  t.f32()[5] = 7.0f;
  const void* storage = t.storage()->data();
  auto a = ch.post(t, 11, 3);
  REQUIRE(a.ok());
  CHECK(a->tag == channel_tag(1, Direction::forward));
  CHECK(a->sequence == 0);
  CHECK(a->microbatch == 11);
  CHECK(a->version == 3);
  CHECK(a->shape() == std::vector<int64_t>{2, 3, 4});
  CHECK(ch.pending() == 1);
  auto got = ch.receive(*a);
  REQUIRE(got.ok());
  CHECK(got->storage()->data() == storage);
  CHECK(got->f32()[5] == 7.0f);
  CHECK(ch.pending() == 0);
  // A second receive of the same announcement fails: the tensor moved out.
  auto again = ch.receive(*a);
  REQUIRE(!again.ok());
  CHECK(again.error().message.find("nothing posted") != std::string::npos);
}

TEST_CASE("sequence numbers follow post order and receives may come in any order") {
  LocalChannel ch(channel_ends(0, Direction::backward));
  std::vector<Announcement> as;
  for (int i = 0; i < 4; ++i) {
    Tensor t = Tensor::zeros({1, i + 1});
    auto a = ch.post(t, 100 + i, 0);
    REQUIRE(a.ok());
    CHECK(a->sequence == static_cast<uint64_t>(i));
    as.push_back(*a);
  }
  for (int i : {2, 0, 3, 1}) {
    auto t = ch.receive(as[static_cast<size_t>(i)]);
    REQUIRE(t.ok());
    CHECK(t->size(1) == i + 1);
  }
}

TEST_CASE("announcements of another channel or with altered metadata are refused") {
  LocalChannel ch(channel_ends(2, Direction::forward));
  auto a = ch.post(Tensor::zeros({4, 8}), 5, 1);
  REQUIRE(a.ok());
  Announcement foreign = *a;
  foreign.tag = channel_tag(2, Direction::backward);
  auto e1 = ch.receive(foreign);
  REQUIRE(!e1.ok());
  CHECK(e1.error().message.find("belongs to channel") != std::string::npos);
  Announcement wrong_shape = *a;
  wrong_shape.dims[1] = 9;
  auto e2 = ch.receive(wrong_shape);
  REQUIRE(!e2.ok());
  CHECK(e2.error().message.find("does not match") != std::string::npos);
  Announcement wrong_mb = *a;
  wrong_mb.microbatch = 6;
  CHECK(!ch.receive(wrong_mb).ok());
  CHECK(ch.pending() == 1);  // failed receives leave the tensor in place
  CHECK(ch.receive(*a).ok());
  CHECK(!ch.post(Tensor(), 1, 0).ok());
}

TEST_CASE("a channel set is created in the fixed order: forward then backward per pair") {
  CHECK(!make_local_channels(0).ok());
  auto one = make_local_channels(1);
  REQUIRE(one.ok());
  CHECK(one->size() == 0);
  CHECK(one->stages() == 1);
  auto set = make_local_channels(4);
  REQUIRE(set.ok());
  CHECK(set->size() == 6);
  CHECK(set->stages() == 4);
  for (int r = 0; r < 3; ++r) {
    const ChannelEnds& f = set->forward(r).ends();
    const ChannelEnds& b = set->backward(r).ends();
    CHECK(f.tag == static_cast<uint32_t>(2 * r));
    CHECK(b.tag == static_cast<uint32_t>(2 * r + 1));
    CHECK(f.from == r);
    CHECK(f.to == r + 1);
    CHECK(b.from == r + 1);
    CHECK(b.to == r);
    CHECK(&set->at(f.tag) == &set->forward(r));
  }
  REQUIRE(set->forward(1).post(Tensor::zeros({1}), 0, 0).ok());
  CHECK(set->pending() == 1);
  set->clear();
  CHECK(set->pending() == 0);
}

TEST_CASE("a partial channel set holds the channels of one process, the others fail clearly") {
  std::vector<std::unique_ptr<TensorChannel>> channels(4);
  channels[2] = std::make_unique<LocalChannel>(channel_ends(1, Direction::forward));
  ChannelSet set = ChannelSet::partial(3, std::move(channels));
  CHECK(set.size() == 4);
  CHECK(set.stages() == 3);
  CHECK(!set.has(0));
  CHECK(!set.has(1));
  CHECK(set.has(2));
  CHECK(!set.has(3));
  CHECK(!set.has(4));
  CHECK(&set.forward(1) == &set.at(2));
  try {
    (void)set.backward(0);
    FAIL("backward(0) of a set without it");
  } catch (const CheckFailure& e) {
    CHECK(std::string(e.what()).find("holds no end of channel 1") != std::string::npos);
  }
  REQUIRE(set.forward(1).post(Tensor::zeros({1}), 0, 0).ok());
  CHECK(set.pending() == 1);  // null entries are skipped
  set.clear();
  CHECK(set.pending() == 0);
  // a channel at the wrong index is refused as in a full set; the full set refuses gaps
  std::vector<std::unique_ptr<TensorChannel>> misplaced(2);
  misplaced[0] = std::make_unique<LocalChannel>(channel_ends(0, Direction::backward));
  CHECK_THROWS_AS(ChannelSet::partial(2, std::move(misplaced)), CheckFailure);
  std::vector<std::unique_ptr<TensorChannel>> gaps(2);
  CHECK_THROWS_AS(ChannelSet(2, std::move(gaps)), CheckFailure);
}

TEST_CASE("a sender and a receiver on two threads move every tensor exactly once") {
  LocalChannel ch(channel_ends(0, Direction::forward));
  constexpr int n = 2000;
  std::vector<Announcement> mailbox(n);
  std::atomic<int> posted{0};
  std::thread sender([&] {
    for (int i = 0; i < n; ++i) {
      Tensor t = Tensor::zeros({1});
      t.f32()[0] = static_cast<float>(i);
      mailbox[static_cast<size_t>(i)] = ch.post(std::move(t), i, 0).value();
      posted.store(i + 1, std::memory_order_release);
    }
  });
  int received = 0;
  float sum = 0;
  while (received < n) {
    if (posted.load(std::memory_order_acquire) <= received) {
      std::this_thread::yield();
      continue;
    }
    auto t = ch.receive(mailbox[static_cast<size_t>(received)]);
    REQUIRE(t.ok());
    CHECK(t->f32()[0] == static_cast<float>(received));
    sum += t->f32()[0];
    ++received;
  }
  sender.join();
  CHECK(sum == static_cast<float>(n) * (n - 1) / 2);
  CHECK(ch.pending() == 0);
}
