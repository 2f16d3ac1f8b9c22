// UCX channel tests: two workers in one process (bytes, order, errors, timeout, pending/clear,
// buffer reuse, the per-process channel set), two processes over shared memory and TCP, idle CPU.
#include "transport/ucx_channel.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kernels/check.hpp"
#include "kernels/checked_backend.hpp"
#include "kernels/context.hpp"
#include "transport/local_channel.hpp"
#include "transport/tools/ucx_peer_protocol.hpp"

extern char** environ;

using namespace actorpipe;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

/// The error message of `e`, empty when it holds a value (for test messages).
template <class T>
std::string why(const Expected<T>& e) {
  return e.ok() ? std::string() : e.error().message;
}

/// Two workers of this process connected both ways.
struct Pair {
  std::shared_ptr<UcxWorker> a, b;
  UcxEndpoint a_to_b, b_to_a;
};

// The announcement of a 1-D f32 payload of `floats` that nobody posted: sequence 0 on channel
// (lower, dir), for microbatch `microbatch`.
Announcement unposted(int lower, Direction dir, int64_t microbatch, int64_t floats) {
  Announcement a;
  a.tag = channel_tag(lower, dir);
  a.sequence = 0;
  a.microbatch = microbatch;
  a.ndim = 1;
  a.dims[0] = floats;
  return a;
}

Pair connected_pair(UcxWorkerOptions oa = {}, UcxWorkerOptions ob = {}) {
  oa.name = "worker a";
  ob.name = "worker b";
  Pair p;
  auto a = UcxWorker::create(oa);
  REQUIRE_MESSAGE(a.ok(), why(a));
  auto b = UcxWorker::create(ob);
  REQUIRE_MESSAGE(b.ok(), why(b));
  p.a = *a;
  p.b = *b;
  auto ab = p.a->connect(p.b->address());
  REQUIRE_MESSAGE(ab.ok(), why(ab));
  auto ba = p.b->connect(p.a->address());
  REQUIRE_MESSAGE(ba.ok(), why(ba));
  p.a_to_b = *ab;
  p.b_to_a = *ba;
  return p;
}

/// A tensor whose bytes follow ucx_peer::pattern(seq, i).
Tensor patterned(std::vector<int64_t> shape, uint64_t seq, DType dtype = DType::f32) {
  Tensor t = Tensor::zeros(std::move(shape), dtype);
  auto* p = static_cast<std::byte*>(t.storage()->data());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = ucx_peer::pattern(seq, i);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.storage()->data(), b.storage()->data(), a.nbytes()) == 0;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// Waits (bounded) until `pred()` holds; true when it did.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 5s) {
  const auto deadline = Clock::now() + limit;
  while (!pred()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

TEST_CASE("two workers in one process move 8 B, 64 KiB and 3 MiB tensors bit for bit") {
  Pair p = connected_pair();
  auto fwd_send = UcxChannel::sender(p.a, channel_ends(0, Direction::forward), p.a_to_b);
  auto fwd_recv = UcxChannel::receiver(p.b, channel_ends(0, Direction::forward));
  auto bwd_send = UcxChannel::sender(p.b, channel_ends(0, Direction::backward), p.b_to_a);
  auto bwd_recv = UcxChannel::receiver(p.a, channel_ends(0, Direction::backward));
  CHECK(fwd_send->end() == UcxChannel::End::sender);
  CHECK(fwd_recv->end() == UcxChannel::End::receiver);

  const std::vector<std::vector<int64_t>> shapes = {{2}, {16, 1024}, {3, 256, 1024}, {2, 3, 4, 5}};
  uint64_t seq = 0;
  for (const auto& shape : shapes) {
    for (DType dtype : {DType::f32, DType::i32}) {
      CAPTURE(seq);
      Tensor t = patterned(shape, seq, dtype);
      auto a = fwd_send->post(t, static_cast<int64_t>(seq) + 10, 2);
      REQUIRE_MESSAGE(a.ok(), why(a));
      CHECK(a->tag == channel_tag(0, Direction::forward));
      CHECK(a->sequence == seq);
      CHECK(a->microbatch == static_cast<int64_t>(seq) + 10);
      CHECK(a->version == 2);
      CHECK(a->shape() == shape);
      auto got = fwd_recv->receive(*a);
      REQUIRE_MESSAGE(got.ok(), why(got));
      CHECK(got->storage() != t.storage());
      CHECK(same_bytes(*got, t));
      // the same bytes go back on the backward channel
      auto back = bwd_send->post(*got, a->microbatch, a->version);
      REQUIRE_MESSAGE(back.ok(), why(back));
      CHECK(back->tag == channel_tag(0, Direction::backward));
      auto returned = bwd_recv->receive(*back);
      REQUIRE_MESSAGE(returned.ok(), why(returned));
      CHECK(same_bytes(*returned, t));
      // once sent, the channel holds no reference to the producer's storage
      REQUIRE(fwd_send->wait_sent(5s).ok());
      CHECK(eventually([&] { return t.storage().use_count() == 1; }));
      ++seq;
    }
  }
  CHECK(fwd_send->pending() == 0);
  REQUIRE(bwd_send->wait_sent(5s).ok());
  CHECK(bwd_send->pending() == 0);
  CHECK(fwd_recv->pending() == 0);
}

TEST_CASE("a tensor in a device's memory is sent from a host copy (host-staged), bit for bit") {
  Pair p = connected_pair();
  auto send = UcxChannel::sender(p.a, channel_ends(0, Direction::forward), p.a_to_b);
  auto recv = UcxChannel::receiver(p.b, channel_ends(0, Direction::forward));
  // the checked device's lasting memory: its pages are closed, so a direct host read of the
  // tensor (a send from its own bytes) faults
  Context ctx(1);
  CheckedBackend device(ctx);
  BackendMemory& memory = device.lasting_memory();
  const Tensor host = patterned({3, 256, 64}, 7);
  Tensor on_device = Tensor::zeros(host.shape(), DType::f32, memory);
  REQUIRE_FALSE(on_device.host_readable());
  memory.to_backend(on_device.f32(), host.f32(), static_cast<size_t>(host.numel()));
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    auto a = send->post(on_device, 4 + round, 1);
    REQUIRE_MESSAGE(a.ok(), why(a));
    auto got = recv->receive(*a);
    REQUIRE_MESSAGE(got.ok(), why(got));
    CHECK(got->host_readable());
    CHECK(same_bytes(*got, host));
    REQUIRE(send->wait_sent(5s).ok());
    CHECK(send->pool_size() >= 1);      // the host copy went into a buffer of the sender's pool
    std::this_thread::sleep_for(20ms);  // UCX lets go of the sent buffer after its completion
  }
  // reused once UCX let go of it: one buffer, two if a round found the last one still held
  CHECK(send->pool_size() <= 2);
}

TEST_CASE("a tag packs the channel in the high 16 bits and the sequence in the low 48") {
  CHECK(ucx_tag(0, 0) == 0);
  CHECK(ucx_tag(3, 5) == ((uint64_t{3} << 48) | 5));
  CHECK(ucx_tag(kUcxMaxChannelTag, kUcxMaxSequence) == ~uint64_t{0});
  CHECK(ucx_tag(1, 0) != ucx_tag(0, uint64_t{1} << 47));
}

TEST_CASE("receives in another order than the posts: sequence 5 before 4 and so on") {
  Pair p = connected_pair();
  auto send = UcxChannel::sender(p.a, channel_ends(1, Direction::forward), p.a_to_b);
  auto recv = UcxChannel::receiver(p.b, channel_ends(1, Direction::forward));
  std::vector<Announcement> as;
  std::vector<Tensor> posted;
  for (uint64_t i = 0; i < 6; ++i) {
    // eager (8 B) and rendezvous (64 KiB) sizes interleaved
    posted.push_back(
        patterned(i % 2 == 0 ? std::vector<int64_t>{2} : std::vector<int64_t>{16384}, i));
    auto a = send->post(posted.back(), static_cast<int64_t>(i), 0);
    REQUIRE(a.ok());
    as.push_back(*a);
  }
  for (size_t i : {5, 4, 0, 3, 1, 2}) {
    CAPTURE(i);
    auto t = recv->receive(as[i]);
    REQUIRE_MESSAGE(t.ok(), why(t));
    CHECK(same_bytes(*t, posted[i]));
  }
  REQUIRE(send->wait_sent(5s).ok());
}

TEST_CASE("a channel that carries its announcements hands each to the receiver, in order") {
  Pair p = connected_pair();
  UcxChannelOptions carry;
  carry.carry_announcements = true;
  auto send = UcxChannel::sender(p.a, channel_ends(1, Direction::forward), p.a_to_b, carry);
  auto recv = UcxChannel::receiver(p.b, channel_ends(1, Direction::forward), carry);
  CHECK(send->announces());
  CHECK_FALSE(recv->announces());
  std::vector<Announcement> posted;
  std::vector<Tensor> tensors;
  // posts before the handler is installed wait in UCX until it is
  for (uint64_t i = 0; i < 3; ++i) {
    tensors.push_back(patterned({i % 2 == 0 ? 2 : 16384}, i));
    auto a = send->post(tensors.back(), static_cast<int64_t>(10 + i), static_cast<int32_t>(i));
    REQUIRE(a.ok());
    posted.push_back(*a);
  }
  std::mutex mu;
  std::vector<Announcement> got;
  REQUIRE(recv->on_announcement([&](const Announcement& a) {
    std::lock_guard<std::mutex> lock(mu);
    got.push_back(a);
  }));
  for (uint64_t i = 3; i < 6; ++i) {
    tensors.push_back(patterned({i % 2 == 0 ? 2 : 16384}, i));
    auto a = send->post(tensors.back(), static_cast<int64_t>(10 + i), static_cast<int32_t>(i));
    REQUIRE(a.ok());
    posted.push_back(*a);
  }
  REQUIRE(eventually([&] {
    std::lock_guard<std::mutex> lock(mu);
    return got.size() == posted.size();
  }));
  {
    std::lock_guard<std::mutex> lock(mu);
    CHECK(got == posted);  // every field, in sequence order
  }
  // each announcement finds its payload
  for (size_t i = 0; i < posted.size(); ++i) {
    auto t = recv->receive(got[i]);
    REQUIRE_MESSAGE(t.ok(), why(t));
    CHECK(same_bytes(*t, tensors[i]));
  }
  REQUIRE(send->wait_sent(5s).ok());
  CHECK(send->pending() == 0);
  // after clear() nothing more is handed on, and the next announcement stays in UCX
  recv->clear();
  tensors.push_back(patterned({2}, 6));
  REQUIRE(send->post(tensors.back(), 16, 6).ok());
  REQUIRE(send->wait_sent(5s).ok());
  std::this_thread::sleep_for(100ms);
  std::lock_guard<std::mutex> lock(mu);
  CHECK(got.size() == posted.size());
}

TEST_CASE(
    "channels that do not carry announcements say so and take no handler, a set carries them on "
    "every channel") {
  Pair p = connected_pair();
  auto send = UcxChannel::sender(p.a, channel_ends(0, Direction::forward), p.a_to_b);
  auto recv = UcxChannel::receiver(p.b, channel_ends(0, Direction::forward));
  CHECK_FALSE(send->announces());
  CHECK_FALSE(recv->on_announcement([](const Announcement&) {}));
  UcxChannelOptions carry;
  carry.carry_announcements = true;
  auto carrying_send =
      UcxChannel::sender(p.a, channel_ends(1, Direction::forward), p.a_to_b, carry);
  CHECK_FALSE(carrying_send->on_announcement([](const Announcement&) {}));  // the wrong end
  // a process's channel set carries them on every channel, the tied parameters' too
  UcxChannelPlan plan;
  plan.rank_of_stage = {0, 1};
  plan.tied = {TiedPair{0, 1}};
  plan.rank = 0;
  plan.worker = p.a;
  plan.peers = {{1, p.a_to_b}};
  plan.options.carry_announcements = true;
  auto set = make_ucx_channels(plan);
  REQUIRE(set.ok());
  CHECK(set->forward(0).announces());
  CHECK(set->backward(0).on_announcement([](const Announcement&) {}));
  // rank 0 holds the owner (stage 0): it receives the copy's gradient, sends the rest
  CHECK(set->tied(0, ChannelKind::tied_to_owner).on_announcement([](const Announcement&) {}));
  for (ChannelKind k :
       {ChannelKind::tied_to_copy, ChannelKind::tied_weights, ChannelKind::tied_prediction})
    CHECK(set->tied(0, k).announces());
}

TEST_CASE("an announcement of another channel is refused before anything is posted") {
  Pair p = connected_pair();
  auto send = UcxChannel::sender(p.a, channel_ends(0, Direction::forward), p.a_to_b);
  auto recv = UcxChannel::receiver(p.b, channel_ends(0, Direction::forward));
  auto a = send->post(patterned({4}, 0), 3, 0);
  REQUIRE(a.ok());
  Announcement foreign = *a;
  foreign.tag = channel_tag(0, Direction::backward);
  auto e = recv->receive(foreign);
  REQUIRE(!e.ok());
  CHECK(contains(e.error().message, "belongs to channel 1"));
  CHECK(contains(e.error().message, "UCX channel 0 (0 -> 1)"));
  CHECK(p.b->outstanding() == 0);
  Announcement bad_dims = *a;
  bad_dims.ndim = 7;
  CHECK(!recv->receive(bad_dims).ok());
  bad_dims = *a;
  bad_dims.dims[0] = -1;
  CHECK(!recv->receive(bad_dims).ok());
  // the real announcement still finds its payload
  auto t = recv->receive(*a);
  REQUIRE_MESSAGE(t.ok(), why(t));
  CHECK(t->shape() == std::vector<int64_t>{4});
}

TEST_CASE("a payload longer or shorter than announced is an error naming the announcement") {
  Pair p = connected_pair();
  auto send = UcxChannel::sender(p.a, channel_ends(0, Direction::forward), p.a_to_b);
  auto recv = UcxChannel::receiver(p.b, channel_ends(0, Direction::forward));
  for (int64_t n : {64, 16384}) {  // eager and rendezvous
    CAPTURE(n);
    auto a = send->post(patterned({n}, 0), 1, 0);
    REQUIRE(a.ok());
    Announcement shorter = *a;  // the buffer is too small: UCX truncates
    shorter.dims[0] = n / 2;
    auto e1 = recv->receive(shorter);
    REQUIRE(!e1.ok());
    CHECK(contains(e1.error().message, to_string(shorter)));
    CHECK(contains(e1.error().message, "truncated"));

    auto b = send->post(patterned({n}, 1), 2, 0);
    REQUIRE(b.ok());
    Announcement longer = *b;  // less arrives than announced
    longer.dims[0] = n * 2;
    auto e2 = recv->receive(longer);
    REQUIRE(!e2.ok());
    CHECK(contains(e2.error().message, to_string(longer)));
    CHECK(contains(e2.error().message, fmt::format("{} B arrived", n * 4)));

    // the channel goes on working
    auto c = send->post(patterned({n}, 2), 3, 0);
    REQUIRE(c.ok());
    auto t = recv->receive(*c);
    REQUIRE_MESSAGE(t.ok(), why(t));
    CHECK(same_bytes(*t, patterned({n}, 2)));
    Status sent = send->wait_sent(5s);
    CHECK_MESSAGE(sent.ok(), why(sent));
    send->clear();  // forget a truncated send's error, if UCX reported one to the sender
  }
}

TEST_CASE("a receive with no payload fails after the timeout, naming channel, sequence, mb") {
  Pair p = connected_pair();
  UcxChannelOptions o;
  o.receive_timeout = 200ms;
  auto send = UcxChannel::sender(p.a, channel_ends(2, Direction::backward), p.a_to_b);
  auto recv = UcxChannel::receiver(p.b, channel_ends(2, Direction::backward), o);
  CHECK(recv->options().receive_timeout == 200ms);
  const Announcement a = unposted(2, Direction::backward, 7, 16);
  const auto t0 = Clock::now();
  auto e = recv->receive(a);
  const auto waited = Clock::now() - t0;
  REQUIRE(!e.ok());
  CHECK(waited >= 200ms);
  CHECK(waited < 3s);
  CHECK(contains(e.error().message, "UCX channel 5 (3 -> 2)"));
  CHECK(contains(e.error().message, "sequence 0"));
  CHECK(contains(e.error().message, "microbatch 7"));
  CHECK(contains(e.error().message, "within 200 ms"));
  // the abandoned receive is cancelled, so it does not take the payload posted afterwards
  CHECK(eventually([&] { return recv->pending() == 0; }));
  CHECK(eventually([&] { return p.b->outstanding() == 0; }));
  auto posted = send->post(patterned({16}, 0), 7, 0);
  REQUIRE(posted.ok());
  CHECK(posted->sequence == 0);
  auto t = recv->receive(*posted);
  REQUIRE_MESSAGE(t.ok(), why(t));
  CHECK(same_bytes(*t, patterned({16}, 0)));
}

TEST_CASE(
    "interrupt ends a receive waiting for a lost peer's payload at once, refuses later ones, "
    "until clear") {
  Pair p = connected_pair();
  UcxChannelOptions o;
  o.receive_timeout = 60s;  // the interrupt, not the timeout, must end the wait
  auto send = UcxChannel::sender(p.a, channel_ends(0, Direction::forward), p.a_to_b);
  auto recv = UcxChannel::receiver(p.b, channel_ends(0, Direction::forward), o);
  const Announcement a = unposted(0, Direction::forward, 3, 16);
  const auto t0 = Clock::now();
  auto waiting = std::async(std::launch::async, [&] { return recv->receive(a); });
  std::this_thread::sleep_for(200ms);
  REQUIRE(waiting.wait_for(0s) == std::future_status::timeout);  // still waiting
  send->interrupt("rank 0 was lost: test");                      // a sender: nothing to end
  recv->interrupt("rank 0 was lost: test");
  REQUIRE(waiting.wait_for(5s) == std::future_status::ready);
  auto e = waiting.get();
  CHECK(Clock::now() - t0 < 5s);
  REQUIRE(!e.ok());
  CHECK(contains(e.error().message, "UCX channel 0 (0 -> 1)"));
  CHECK(contains(e.error().message, "microbatch 3"));
  CHECK(contains(e.error().message, "will not come: rank 0 was lost: test"));
  auto later = recv->receive(a);  // fails at once
  REQUIRE(!later.ok());
  CHECK(contains(later.error().message, "rank 0 was lost: test"));
  CHECK(eventually([&] { return p.b->outstanding() == 0; }));
  // clear() ends the interruption: the channel receives again
  recv->clear();
  send->clear();
  auto posted = send->post(patterned({16}, 1), 3, 0);
  REQUIRE(posted.ok());
  auto t = recv->receive(*posted);
  REQUIRE_MESSAGE(t.ok(), why(t));
  CHECK(same_bytes(*t, patterned({16}, 1)));
}

TEST_CASE("pending counts sends in flight, the tensor is held until then, clear forgets them") {
  UcxWorkerOptions quick;
  quick.close_timeout = 200ms;  // teardown does not wait long for what is never received
  Pair p = connected_pair(quick, quick);
  auto send = UcxChannel::sender(p.a, channel_ends(0, Direction::forward), p.a_to_b);
  auto recv = UcxChannel::receiver(p.b, channel_ends(0, Direction::forward));
  CHECK(send->pending() == 0);
  // 3 MiB goes by rendezvous: the send completes only once the receiver takes it
  Tensor big = patterned({3, 256, 1024}, 0);
  auto a = send->post(big, 0, 0);
  REQUIRE(a.ok());
  std::this_thread::sleep_for(50ms);
  CHECK(send->pending() == 1);
  CHECK(big.storage().use_count() == 2);  // ours and the channel's
  auto e = send->wait_sent(50ms);
  REQUIRE(!e.ok());
  CHECK(contains(e.error().message, "1 sends still pending"));
  auto t = recv->receive(*a);
  REQUIRE(t.ok());
  REQUIRE(send->wait_sent(5s).ok());
  CHECK(send->pending() == 0);
  CHECK(eventually([&] { return big.storage().use_count() == 1; }));

  Tensor second = patterned({3, 256, 1024}, 1);
  auto b = send->post(second, 1, 0);
  REQUIRE(b.ok());
  std::this_thread::sleep_for(20ms);
  CHECK(send->pending() == 1);
  send->clear();
  CHECK(send->pending() == 0);
  // the forgotten send still delivers; then the storage is released
  auto t2 = recv->receive(*b);
  REQUIRE_MESSAGE(t2.ok(), why(t2));
  CHECK(same_bytes(*t2, second));
  CHECK(eventually([&] { return second.storage().use_count() == 1; }));
  CHECK(send->pending() == 0);

  // a third one never received: clear() on the receiver end has nothing to forget, and the
  // worker's teardown closes the endpoint within close_timeout
  REQUIRE(send->post(patterned({3, 256, 1024}, 2), 2, 0).ok());
  recv->clear();
  CHECK(recv->pending() == 0);
}

TEST_CASE("received buffers come from a pool and are reused once every holder dropped them") {
  Pair p = connected_pair();
  auto send = UcxChannel::sender(p.a, channel_ends(0, Direction::forward), p.a_to_b);
  UcxChannelOptions o;
  o.pool_capacity = 3;
  auto recv = UcxChannel::receiver(p.b, channel_ends(0, Direction::forward), o);
  recv->reserve(DType::f32, {8, 8}, 2);
  CHECK(recv->pool_size() == 2);
  const void* first = nullptr;
  {
    auto a = send->post(patterned({8, 8}, 0), 0, 0);
    REQUIRE(a.ok());
    auto t = recv->receive(*a);
    REQUIRE(t.ok());
    first = t->storage()->data();
  }
  auto b = send->post(patterned({8, 8}, 1), 1, 0);
  REQUIRE(b.ok());
  auto held = recv->receive(*b);
  REQUIRE(held.ok());
  CHECK(held->storage()->data() == first);  // the first consumer is gone: same buffer
  auto c = send->post(patterned({8, 8}, 2), 2, 0);
  REQUIRE(c.ok());
  auto other = recv->receive(*c);
  REQUIRE(other.ok());
  CHECK(other->storage()->data() != first);  // `held` still holds it
  CHECK(same_bytes(*held, patterned({8, 8}, 1)));
  CHECK(same_bytes(*other, patterned({8, 8}, 2)));
  CHECK(recv->pool_size() == 2);
  // other shapes of the same byte size share buffers; beyond the capacity nothing is kept
  auto d = send->post(patterned({4, 16}, 3), 3, 0);
  REQUIRE(d.ok());
  auto reshaped = recv->receive(*d);
  REQUIRE(reshaped.ok());
  CHECK(reshaped->shape() == std::vector<int64_t>{4, 16});
  CHECK(recv->pool_size() == 3);
  for (int i = 0; i < 3; ++i) {
    auto e = send->post(patterned({100 + i}, 4), 4, 0);
    REQUIRE(e.ok());
    CHECK(recv->receive(*e).ok());
  }
  CHECK(recv->pool_size() == 3);
}

TEST_CASE("misuse: wrong end, undefined tensor, empty address, bad UCX option") {
  Pair p = connected_pair();
  auto send = UcxChannel::sender(p.a, channel_ends(0, Direction::forward), p.a_to_b);
  auto recv = UcxChannel::receiver(p.b, channel_ends(0, Direction::forward));
  CHECK_THROWS_AS((void)recv->post(patterned({1}, 0), 0, 0), CheckFailure);
  CHECK_THROWS_AS((void)send->receive(Announcement{}), CheckFailure);
  CHECK_THROWS_AS(UcxChannel::sender(p.a, channel_ends(0, Direction::forward), UcxEndpoint{}),
                  CheckFailure);
  auto undefined = send->post(Tensor(), 4, 0);
  REQUIRE(!undefined.ok());
  CHECK(contains(undefined.error().message, "undefined tensor for microbatch 4"));
  CHECK(send->pending() == 0);

  auto empty = p.a->connect({});
  REQUIRE(!empty.ok());
  CHECK(contains(empty.error().message, "empty"));
  CHECK(!p.a->endpoint_info(UcxEndpoint{42}).ok());

  UcxWorkerOptions bad;
  bad.config.emplace_back("RNDV_THRESH", "lots");
  auto w = UcxWorker::create(bad);
  REQUIRE(!w.ok());
  CHECK(contains(w.error().message, "ucp_config_modify(RNDV_THRESH = \"lots\")"));

  // a send to an endpoint this worker does not have fails on the channel's next post
  auto stray = UcxChannel::sender(p.a, channel_ends(1, Direction::forward), UcxEndpoint{9});
  REQUIRE(stray->post(patterned({1}, 0), 0, 0).ok());
  auto failed = stray->wait_sent(5s);
  REQUIRE(!failed.ok());
  CHECK(contains(failed.error().message, "no endpoint 9"));
  auto next = stray->post(patterned({1}, 0), 1, 0);
  REQUIRE(!next.ok());
  CHECK(contains(next.error().message, "not posting microbatch 1"));
}

TEST_CASE("a process holding some stages gets local, UCX and no channels in the fixed order") {
  Pair p = connected_pair();
  // stages 0 and 1 on rank 0 (worker a), stage 2 on rank 1 (worker b)
  UcxChannelPlan plan0{{0, 0, 1}, {}, 0, p.a, {{1, p.a_to_b}}, {}, {}};
  UcxChannelPlan plan1{{0, 0, 1}, {}, 1, p.b, {{0, p.b_to_a}}, {}, {}};
  auto set0 = make_ucx_channels(plan0);
  REQUIRE_MESSAGE(set0.ok(), why(set0));
  auto set1 = make_ucx_channels(plan1);
  REQUIRE_MESSAGE(set1.ok(), why(set1));
  CHECK(set0->size() == 4);
  CHECK(set0->stages() == 3);
  for (uint32_t tag = 0; tag < 4; ++tag) CHECK(set0->has(tag));
  CHECK(!set1->has(0));
  CHECK(!set1->has(1));
  CHECK(set1->has(2));
  CHECK(set1->has(3));
  CHECK(!set1->has(4));
  CHECK(dynamic_cast<LocalChannel*>(&set0->forward(0)) != nullptr);
  auto* f1 = dynamic_cast<UcxChannel*>(&set0->forward(1));
  REQUIRE(f1 != nullptr);
  CHECK(f1->end() == UcxChannel::End::sender);
  CHECK(dynamic_cast<UcxChannel&>(set0->backward(1)).end() == UcxChannel::End::receiver);
  CHECK(dynamic_cast<UcxChannel&>(set1->forward(1)).end() == UcxChannel::End::receiver);
  CHECK(dynamic_cast<UcxChannel&>(set1->backward(1)).end() == UcxChannel::End::sender);
  CHECK_THROWS_AS(set1->forward(0), CheckFailure);
  CHECK_THROWS_AS(set1->at(1), CheckFailure);

  // stage 1 -> stage 2 and back
  Tensor act = patterned({4, 32}, 0);
  auto a = set0->forward(1).post(act, 5, 0);
  REQUIRE(a.ok());
  auto got = set1->forward(1).receive(*a);
  REQUIRE_MESSAGE(got.ok(), why(got));
  CHECK(same_bytes(*got, act));
  auto g = set1->backward(1).post(*got, 5, 0);
  REQUIRE(g.ok());
  auto grad = set0->backward(1).receive(*g);
  REQUIRE_MESSAGE(grad.ok(), why(grad));
  CHECK(same_bytes(*grad, act));
  set0->clear();
  set1->clear();
  CHECK(set0->pending() == 0);
  CHECK(set1->pending() == 0);

  // a tied parameter between stage 0 (rank 0) and stage 2 (rank 1): its four channels follow
  UcxChannelPlan tied0{{0, 0, 1}, {{0, 2}}, 0, p.a, {{1, p.a_to_b}}, {}, {}};
  UcxChannelPlan tied1{{0, 0, 1}, {{0, 2}}, 1, p.b, {{0, p.b_to_a}}, {}, {}};
  auto t0 = make_ucx_channels(tied0);
  auto t1 = make_ucx_channels(tied1);
  REQUIRE((t0.ok() && t1.ok()));
  CHECK(t0->size() == 8);
  CHECK(t0->tied(0, ChannelKind::tied_weights).ends().tag == 6);
  Tensor w = Tensor::zeros({5});
  std::fill_n(w.f32(), 5, 1.5f);
  auto wa = t0->tied(0, ChannelKind::tied_weights).post(w, -1, 3);
  REQUIRE(wa.ok());
  auto wr = t1->at(wa->tag).receive(*wa);
  REQUIRE_MESSAGE(wr.ok(), why(wr));
  CHECK(same_bytes(*wr, w));
  CHECK(!make_ucx_channels(UcxChannelPlan{{0, 1}, {{0, 2}}, 0, p.a, {{1, p.a_to_b}}, {}, {}}).ok());

  // one process holding every stage needs no worker
  auto all_local = make_ucx_channels(UcxChannelPlan{{0, 0, 0}, {}, 0, nullptr, {}, {}, {}});
  REQUIRE(all_local.ok());
  CHECK(all_local->size() == 4);
  auto no_peer = make_ucx_channels(UcxChannelPlan{{0, 0, 1}, {}, 0, p.a, {}, {}, {}});
  REQUIRE(!no_peer.ok());
  CHECK(contains(no_peer.error().message, "no endpoint to rank 1"));
  CHECK(!make_ucx_channels(UcxChannelPlan{{0, 1}, {}, 0, nullptr, {{1, p.a_to_b}}, {}, {}}).ok());
  CHECK(!make_ucx_channels(UcxChannelPlan{}).ok());
  CHECK(!make_ucx_channels(UcxChannelPlan{{0, -1}, {}, 0, p.a, {}, {}, {}}).ok());
  // the strict constructor still wants every channel
  std::vector<std::unique_ptr<TensorChannel>> gaps(2);
  CHECK_THROWS_AS(ChannelSet(2, std::move(gaps)), CheckFailure);
}

TEST_CASE("a sender thread and a receiver thread move 300 tensors of mixed sizes, then timings") {
  Pair p = connected_pair();
  auto send = UcxChannel::sender(p.a, channel_ends(0, Direction::forward), p.a_to_b);
  auto recv = UcxChannel::receiver(p.b, channel_ends(0, Direction::forward));
  constexpr int n = 300;
  const std::vector<int64_t> sizes = {2, 16384, 786432};
  std::vector<Announcement> mailbox(n);
  std::atomic<int> posted{0};
  std::thread sender([&] {
    for (int i = 0; i < n; ++i) {
      auto a = send->post(patterned({sizes[static_cast<size_t>(i) % 3]}, static_cast<uint64_t>(i)),
                          i, 0);
      if (!a.ok()) return;
      mailbox[static_cast<size_t>(i)] = *a;
      posted.store(i + 1, std::memory_order_release);
    }
  });
  int ok = 0;
  const auto deadline = Clock::now() + 60s;
  for (int i = 0; i < n && Clock::now() < deadline;) {
    if (posted.load(std::memory_order_acquire) <= i) {
      std::this_thread::sleep_for(100us);
      continue;
    }
    auto t = recv->receive(mailbox[static_cast<size_t>(i)]);
    if (t.ok() &&
        same_bytes(*t, patterned({sizes[static_cast<size_t>(i) % 3]}, static_cast<uint64_t>(i))))
      ++ok;
    ++i;
  }
  sender.join();
  CHECK(ok == n);
  REQUIRE(send->wait_sent(5s).ok());

  // timings (informative): post + receive on one thread, 8 B and 3 MiB
  constexpr int small_iters = 2000, big_iters = 40;
  Tensor small = patterned({2}, 0), big = patterned({786432}, 0);
  auto t0 = Clock::now();
  for (int i = 0; i < small_iters; ++i) {
    auto a = send->post(small, i, 0);
    REQUIRE(a.ok());
    REQUIRE(recv->receive(*a).ok());
  }
  const double small_us =
      std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / small_iters;
  t0 = Clock::now();
  for (int i = 0; i < big_iters; ++i) {
    auto a = send->post(big, i, 0);
    REQUIRE(a.ok());
    REQUIRE(recv->receive(*a).ok());
  }
  const double big_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf(
      "ucx channel, two workers in one process: 8 B post+receive %.1f us; 3 MiB %.2f GB/s\n",
      small_us, static_cast<double>(big.nbytes()) * big_iters / big_s / 1e9);
}

TEST_CASE("caller progress: a waiting receive takes its payload on its own thread") {
  for (const bool caller : {true, false}) {
    CAPTURE(caller);
    UcxWorkerOptions o;
    o.caller_progress = caller;
    Pair p = connected_pair(o, o);
    UcxChannelOptions co;
    co.spin_before_wait = 50ms;  // long enough for the payload to land within the spin
    auto send = UcxChannel::sender(p.a, channel_ends(0, Direction::forward), p.a_to_b, co);
    auto recv = UcxChannel::receiver(p.b, channel_ends(0, Direction::forward), co);
    for (int i = 0; i < 10; ++i) {
      const Tensor t = patterned({i % 2 == 0 ? 2 : 262144}, static_cast<uint64_t>(i));
      Announcement a;
      bool posted_ok = false;
      // the receive waits first: the payload is posted 2 ms later from another thread
      std::thread sender([&] {
        std::this_thread::sleep_for(2ms);
        auto posted = send->post(t, i, 0);
        posted_ok = posted.ok();
        if (posted_ok) a = *posted;
      });
      Announcement expect;
      expect.tag = send->ends().tag;
      expect.sequence = static_cast<uint64_t>(i);
      expect.microbatch = i;
      expect.dtype = t.dtype();
      expect.ndim = t.dim();
      for (int d = 0; d < t.dim(); ++d) expect.dims[static_cast<size_t>(d)] = t.size(d);
      auto got = recv->receive(expect);
      sender.join();
      REQUIRE(posted_ok);
      REQUIRE_MESSAGE(got.ok(), why(got));
      CHECK(same_bytes(*got, t));
      CHECK(a == expect);
    }
    REQUIRE(send->wait_sent(5000ms).ok());
    if (caller) {
      CHECK(p.b->polls() > 0);  // the receiving thread progressed the worker itself
    } else {
      CHECK(p.a->polls() + p.b->polls() == 0);
    }
  }
}

TEST_CASE("caller progress: a poller between begin_wait and end_wait, then the progress thread") {
  Pair p = connected_pair();
  auto send = UcxChannel::sender(p.a, channel_ends(0, Direction::forward), p.a_to_b);
  auto recv = UcxChannel::receiver(p.b, channel_ends(0, Direction::forward));
  // a thread polls worker b for a while and stops; sends made meanwhile and afterwards arrive
  std::atomic<bool> stop{false};
  std::thread poller([&] {
    const auto until = Clock::now() + 2s;
    while (!stop.load() && Clock::now() < until) {
      p.b->begin_wait();
      for (int i = 0; i < 100; ++i) p.b->poll();
      p.b->end_wait(true);
      std::this_thread::sleep_for(200us);
    }
  });
  for (int i = 0; i < 50; ++i) {
    const Tensor t = patterned({i % 3 == 0 ? 300000 : 7}, static_cast<uint64_t>(i));
    auto a = send->post(t, i, 0);
    REQUIRE(a.ok());
    auto got = recv->receive(*a);
    REQUIRE_MESSAGE(got.ok(), why(got));
    CHECK(same_bytes(*got, t));
  }
  stop = true;
  poller.join();
  // nobody polls now: the progress threads carry on alone
  for (int i = 50; i < 60; ++i) {
    const Tensor t = patterned({100000}, static_cast<uint64_t>(i));
    auto a = send->post(t, i, 0);
    REQUIRE(a.ok());
    auto got = recv->receive(*a);
    REQUIRE_MESSAGE(got.ok(), why(got));
    CHECK(same_bytes(*got, t));
  }
  CHECK(send->wait_sent(5000ms).ok());
}

TEST_CASE("make_ucx_channels hands out the worker as the set's poller") {
  Pair p = connected_pair();
  UcxChannelPlan plan;
  plan.rank_of_stage = {0, 1};
  plan.rank = 0;
  plan.worker = p.a;
  plan.peers = {{1, p.a_to_b}};
  auto set = make_ucx_channels(plan);
  REQUIRE_MESSAGE(set.ok(), why(set));
  REQUIRE(set->poller() != nullptr);
  set->poller()->begin_wait();
  set->poller()->poll();
  set->poller()->end_wait(true);
  const auto local = make_local_channels(2);
  REQUIRE(local.ok());
  CHECK(local->poller() == nullptr);
}

TEST_CASE("idle workers sleep: under 5% of a core over 0.5 s") {
  Pair p = connected_pair();
  auto send = UcxChannel::sender(p.a, channel_ends(0, Direction::forward), p.a_to_b);
  auto recv = UcxChannel::receiver(p.b, channel_ends(0, Direction::forward));
  auto a = send->post(patterned({16384}, 0), 0, 0);  // wire the endpoints up first
  REQUIRE(a.ok());
  REQUIRE(recv->receive(*a).ok());
  std::this_thread::sleep_for(100ms);
  const uint64_t wakeups0 = p.a->wakeups() + p.b->wakeups();
  const double cpu0 = process_cpu_seconds();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(500ms);
  const double cpu = process_cpu_seconds() - cpu0;
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const uint64_t wakeups = p.a->wakeups() + p.b->wakeups() - wakeups0;
  std::printf("idle UCX workers: %.2f ms CPU in %.0f ms (%.2f%% of a core), %llu wake-ups\n",
              cpu * 1e3, wall * 1e3, 100.0 * cpu / wall, static_cast<unsigned long long>(wakeups));
  CHECK(cpu < 0.05 * wall);
}

// ---- two processes ----

namespace {

/// A child process that is always reaped: waited for within a bound, killed past it.
class Child {
 public:
  explicit Child(pid_t pid) : pid_(pid) {}
  ~Child() { kill(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  /// The exit status, or -1 when it had to be killed after `limit` (or died of a signal).
  int wait(std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    int status = 0;
    for (;;) {
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (r < 0 || Clock::now() > deadline) {
        kill();
        return -1;
      }
      std::this_thread::sleep_for(5ms);
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  /// Ends it now (SIGKILL) and reaps it.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_;
};

/// The parent's side of a running ucx_channel_peer: the child, the socket to it, a worker and
/// an endpoint to the child's worker.
struct PeerSession {
  std::unique_ptr<Child> child;
  int fd = -1;
  std::shared_ptr<UcxWorker> worker;
  UcxEndpoint ep;
  PeerSession() = default;
  PeerSession(const PeerSession&) = delete;
  PeerSession& operator=(const PeerSession&) = delete;
  ~PeerSession() {
    worker.reset();  // close the endpoint while the child may still be there
    if (fd >= 0) ::close(fd);
  }
};

/// Starts ucx_channel_peer with UCX transports `tls` ("" = default) and connects to it.
void start_peer(PeerSession& s, const std::string& tls, UcxWorkerOptions options) {
  int fds[2] = {-1, -1};
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  s.fd = fds[0];
  const int theirs = fds[1];
  REQUIRE(::fcntl(theirs, F_SETFD, 0) == 0);  // the child inherits its end
  const std::string peer = ACTORPIPE_UCX_PEER;
  const std::string fd_arg = std::to_string(theirs);
  std::vector<char*> argv = {const_cast<char*>(peer.c_str()), const_cast<char*>(fd_arg.c_str())};
  if (!tls.empty()) argv.push_back(const_cast<char*>(tls.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, peer.c_str(), nullptr, nullptr, argv.data(), environ);
  ::close(theirs);
  REQUIRE_MESSAGE(spawned == 0, "posix_spawn ", peer, ": error ", spawned);
  s.child = std::make_unique<Child>(pid);

  options.name = "ucx parent";
  if (!tls.empty()) options.config.emplace_back("TLS", tls);
  auto worker = UcxWorker::create(options);
  REQUIRE_MESSAGE(worker.ok(), why(worker));
  s.worker = *worker;
  const auto& own = s.worker->address();
  REQUIRE(ucx_peer::send_frame(s.fd, ucx_peer::Kind::address, own.data(), own.size(), 30s).ok());
  auto peer_address = ucx_peer::recv_frame(s.fd, 30s);
  REQUIRE_MESSAGE(peer_address.ok(), why(peer_address));
  REQUIRE(peer_address->kind == ucx_peer::Kind::address);
  auto ep = s.worker->connect(peer_address->payload);
  REQUIRE_MESSAGE(ep.ok(), why(ep));
  s.ep = *ep;
}

/// Runs the parent's side of the exchange with ucx_channel_peer over UCX transports `tls`; the
/// endpoint's description must contain `expect_transport`.
void two_process_exchange(const std::string& tls, const std::string& expect_transport) {
  PeerSession session;
  start_peer(session, tls, {});
  const int ours = session.fd;
  UcxChannelOptions channel_options;
  channel_options.receive_timeout = 20s;
  auto forward = UcxChannel::sender(session.worker, channel_ends(0, Direction::forward), session.ep,
                                    channel_options);
  auto backward =
      UcxChannel::receiver(session.worker, channel_ends(0, Direction::backward), channel_options);

  // 8 B, 64 KiB, 3 MiB and a 4-D i32 tensor; announced in another order than posted
  std::vector<Tensor> posted = {patterned({2}, 0), patterned({16384}, 1),
                                patterned({3, 256, 1024}, 2),
                                patterned({2, 3, 4, 5}, 3, DType::i32)};
  std::vector<Announcement> as;
  for (size_t i = 0; i < posted.size(); ++i) {
    auto a = forward->post(posted[i], static_cast<int64_t>(i), 1);
    REQUIRE(a.ok());
    as.push_back(*a);
  }
  for (size_t i : {3, 1, 0, 2})
    REQUIRE(
        ucx_peer::send_frame(ours, ucx_peer::Kind::announcement, &as[i], sizeof(Announcement), 30s)
            .ok());
  REQUIRE(ucx_peer::send_frame(ours, ucx_peer::Kind::done, nullptr, 0, 30s).ok());

  int replies = 0;
  std::string failure;
  for (int frames = 0; frames < 100; ++frames) {
    auto f = ucx_peer::recv_frame(ours, 30s);
    REQUIRE_MESSAGE(f.ok(), why(f));
    if (f->kind == ucx_peer::Kind::done) break;
    if (f->kind == ucx_peer::Kind::failure) {
      failure.assign(reinterpret_cast<const char*>(f->payload.data()), f->payload.size());
      break;
    }
    auto a = ucx_peer::announcement_of(*f);
    REQUIRE_MESSAGE(a.ok(), why(a));
    auto t = backward->receive(*a);
    REQUIRE_MESSAGE(t.ok(), why(t));
    const auto i = static_cast<size_t>(a->microbatch);
    REQUIRE(i < posted.size());
    CHECK(t->shape() == posted[i].shape());
    CHECK(t->dtype() == posted[i].dtype());
    const auto* got = static_cast<const std::byte*>(t->storage()->data());
    const auto* sent = static_cast<const std::byte*>(posted[i].storage()->data());
    size_t wrong = 0;
    for (size_t k = 0; k < t->nbytes(); ++k) wrong += got[k] != (sent[k] ^ ucx_peer::kReplyMask);
    CHECK(wrong == 0);
    ++replies;
  }
  CHECK_MESSAGE(failure.empty(), "peer: ", failure);
  CHECK(replies == static_cast<int>(posted.size()));
  REQUIRE(forward->wait_sent(10s).ok());
  if (!expect_transport.empty()) {
    auto info = session.worker->endpoint_info(session.ep);
    REQUIRE(info.ok());
    INFO(*info);
    CHECK(contains(*info, expect_transport));
  }
  CHECK(ucx_peer::send_frame(ours, ucx_peer::Kind::done, nullptr, 0, 5s).ok());  // bye
  CHECK(session.child->wait(30s) == 0);
}

}  // namespace

TEST_CASE("two processes exchange tensors both ways (default UCX transports)") {
  // shared memory (sysv or posix, with cma) unless the environment chose transports; the
  // ThreadSanitizer runs leave out sysv only (tests/sanitizers/tsan_run.sh), posix remains
  const char* tls = std::getenv("UCX_TLS");
  const bool shared_memory = tls == nullptr || std::string_view(tls) == "^sysv";
  two_process_exchange("", shared_memory ? "/memory" : "");
}

TEST_CASE("two processes exchange tensors both ways over TCP (UCX_TLS=tcp)") {
  two_process_exchange("tcp", "tcp/");
}

TEST_CASE("a vanished peer: sends fail or stay pending, receives time out, teardown is bounded") {
  for (bool detect : {true, false}) {
    CAPTURE(detect);
    PeerSession session;
    UcxWorkerOptions options;
    options.detect_peer_failure = detect;  // UCX then picks TCP
    options.close_timeout = 300ms;
    start_peer(session, "", options);
    UcxChannelOptions channel_options;
    channel_options.receive_timeout = 300ms;
    auto forward = UcxChannel::sender(session.worker, channel_ends(0, Direction::forward),
                                      session.ep, channel_options);
    auto backward =
        UcxChannel::receiver(session.worker, channel_ends(0, Direction::backward), channel_options);
    session.child->kill();

    const auto t0 = Clock::now();
    REQUIRE(forward->post(patterned({3, 256, 1024}, 0), 0, 0).ok());  // never blocks
    CHECK(Clock::now() - t0 < 1s);
    auto sent = forward->wait_sent(detect ? 10s : 300ms);
    REQUIRE(!sent.ok());
    if (detect) {  // the endpoint reports the loss: the send fails and later posts are refused
      CHECK(contains(sent.error().message, "the send of tag 0 #0"));
      CHECK(!forward->post(patterned({2}, 1), 1, 0).ok());
    } else {  // without detection: pending, or failed if the transport noticed anyway
      MESSAGE(sent.error().message);
      CHECK((contains(sent.error().message, "1 sends still pending") ||
             contains(sent.error().message, "the send of tag 0 #0")));
    }
    const Announcement a = unposted(0, Direction::backward, 3, 4);
    auto got = backward->receive(a);
    REQUIRE(!got.ok());
    CHECK(contains(got.error().message, "within 300 ms"));

    forward.reset();
    backward.reset();
    const auto t1 = Clock::now();
    session.worker.reset();
    CHECK(Clock::now() - t1 < 3s);
  }
}

namespace {

/// A sender and a receiver of forward channel 0 between the two workers of `p`, announcing on
/// the channel, the sender lending from its arena (chunks of `chunk` bytes).
struct SharedEnds {
  std::unique_ptr<UcxChannel> send, recv;
  std::mutex mu;
  std::vector<Announcement> got;

  SharedEnds(Pair& p, size_t chunk = size_t{2} << 20) {
    UcxChannelOptions o;
    o.carry_announcements = true;
    o.shared_memory = true;
    o.shared_chunk_bytes = chunk;
    o.receive_timeout = 5s;
    send = UcxChannel::sender(p.a, channel_ends(0, Direction::forward), p.a_to_b, o);
    recv = UcxChannel::receiver(p.b, channel_ends(0, Direction::forward), o, p.b_to_a);
    REQUIRE(recv->on_announcement([this](const Announcement& a) {
      std::lock_guard<std::mutex> lock(mu);
      got.push_back(a);
    }));
  }
  /// Announcement `i` once it arrived.
  Announcement announcement(size_t i) {
    REQUIRE(eventually([&] {
      std::lock_guard<std::mutex> lock(mu);
      return got.size() > i;
    }));
    std::lock_guard<std::mutex> lock(mu);
    return got[i];
  }
};

}  // namespace

TEST_CASE("shared memory: a tensor from the sender's arena is lent, read in place, handed back") {
  Pair p = connected_pair();
  SharedEnds e(p);
  REQUIRE_MESSAGE(e.send->send_memory() != nullptr, e.send->shared_memory_note());
  CHECK(e.send->shared_memory_note().empty());
  CHECK(e.recv->send_memory() == nullptr);

  Tensor x = Tensor::zeros({4, 1024}, DType::f32, *e.send->send_memory());
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = static_cast<float>(i) * 0.25f;
  REQUIRE(e.send->post(x, 3, 1).ok());
  Announcement a = e.announcement(0);
  CHECK(a.microbatch == 3);
  CHECK(a.shape() == std::vector<int64_t>{4, 1024});
  auto t = e.recv->receive(a);
  REQUIRE_MESSAGE(t.ok(), why(t));
  CHECK(same_bytes(*t, x));
  // in place: no copy was made, a write on the sender's side shows through the receiver's view
  x.f32()[5] = -42.0f;
  CHECK(t->f32()[5] == -42.0f);
  CHECK(e.send->lent() == 1);
  CHECK(x.storage().use_count() == 2);  // the channel holds it for the receiver
  ChannelTraffic traffic = e.send->traffic();
  CHECK(traffic.lent == 1);
  CHECK(traffic.copied == 0);
  // the receiver's last holder drops it: the sender gets it back, its producer may reuse it
  *t = Tensor();
  CHECK(eventually([&] { return e.send->lent() == 0; }));
  CHECK(x.storage().use_count() == 1);
  REQUIRE(e.send->wait_sent(5s).ok());
  CHECK(e.send->pending() == 0);

  // a tensor from elsewhere on the same channel goes by copy
  Tensor y = patterned({1000}, 1);
  REQUIRE(e.send->post(y, 4, 1).ok());
  auto ty = e.recv->receive(e.announcement(1));
  REQUIRE_MESSAGE(ty.ok(), why(ty));
  CHECK(same_bytes(*ty, y));
  CHECK(ty->storage()->data() != y.storage()->data());
  traffic = e.send->traffic();
  CHECK(traffic.lent == 1);
  CHECK(traffic.copied == 1);
  CHECK(traffic.copied_bytes == 4000);
}

TEST_CASE("shared memory: tensors in a second, larger chunk, many lent at once, clear drops them") {
  Pair p = connected_pair();
  SharedEnds e(p, size_t{2} << 20);
  REQUIRE_MESSAGE(e.send->send_memory() != nullptr, e.send->shared_memory_note());
  BackendMemory& arena = *e.send->send_memory();
  // 3 MiB: beyond the first chunk, so the arena maps a second one whose key goes with it
  std::vector<Tensor> sent;
  for (int i = 0; i < 3; ++i) {
    sent.push_back(Tensor::zeros({3, 256, 1024}, DType::f32, arena));
    for (int64_t j = 0; j < sent.back().numel(); j += 997) sent.back().f32()[j] = float(i + j);
    REQUIRE(e.send->post(sent.back(), i, 0).ok());
  }
  std::vector<Tensor> held;
  for (size_t i = 0; i < 3; ++i) {
    auto t = e.recv->receive(e.announcement(i));
    REQUIRE_MESSAGE(t.ok(), why(t));
    CHECK(same_bytes(*t, sent[i]));
    held.push_back(std::move(*t));
  }
  CHECK(e.send->lent() == 3);
  // received out of order is fine: the hand-backs come in any order
  held[1] = Tensor();
  CHECK(eventually([&] { return e.send->lent() == 2; }));
  CHECK(sent[1].storage().use_count() == 1);
  CHECK(sent[0].storage().use_count() == 2);
  // after a failure the sender forgets what it lent: its producer gets the tensors back
  e.send->clear();
  CHECK(e.send->lent() == 0);
  CHECK(sent[0].storage().use_count() == 1);
  held.clear();  // hand-backs nobody waits for any more: harmless
  std::this_thread::sleep_for(20ms);
  CHECK(e.send->lent() == 0);
}

TEST_CASE(
    "shared memory where the peer cannot map it (UCX_TLS=tcp): copies, and the note says why") {
  UcxWorkerOptions tcp;
  tcp.config.emplace_back("TLS", "tcp");
  Pair p = connected_pair(tcp, tcp);
  SharedEnds e(p);
  CHECK(e.send->send_memory() == nullptr);
  CHECK(contains(e.send->shared_memory_note(), "cannot be shared"));
  Tensor y = patterned({4096}, 2);
  REQUIRE(e.send->post(y, 0, 0).ok());
  auto t = e.recv->receive(e.announcement(0));
  REQUIRE_MESSAGE(t.ok(), why(t));
  CHECK(same_bytes(*t, y));
  CHECK(e.send->traffic().copied == 1);
  CHECK(e.send->traffic().lent == 0);

  // and without announcements on the channel there is no lending either
  UcxChannelOptions o;
  o.shared_memory = true;
  Pair q = connected_pair();
  auto plain = UcxChannel::sender(q.a, channel_ends(0, Direction::forward), q.a_to_b, o);
  CHECK(plain->send_memory() == nullptr);
  CHECK(contains(plain->shared_memory_note(), "carry_announcements"));
}

TEST_CASE("shared memory: a malformed lent announcement is an error naming what is wrong") {
  Pair p = connected_pair();
  SharedEnds e(p);
  auto raw = [&](uint64_t sequence, std::vector<std::byte> bytes) {
    auto msg = std::make_shared<std::vector<std::byte>>(std::move(bytes));
    p.a->tag_send(p.a_to_b, msg->data(), msg->size(),
                  ucx_tag(channel_tag(0, Direction::forward) | kUcxAnnouncementTagBit, sequence),
                  [msg](const Status&, size_t) {});
  };
  Announcement a = unposted(0, Direction::forward, 7, 16);
  auto with = [&](uint64_t sequence, const void* extra, size_t n) {
    a.sequence = sequence;
    std::vector<std::byte> m(sizeof(Announcement) + n);
    std::memcpy(m.data(), &a, sizeof(Announcement));
    if (n > 0) std::memcpy(m.data() + sizeof(Announcement), extra, n);
    return m;
  };
  const char junk[10] = {};
  raw(0, with(0, junk, sizeof junk));  // too short for a header
  UcxLentHeader bad_magic;
  bad_magic.magic = 1;
  raw(1, with(1, &bad_magic, sizeof bad_magic));
  UcxLentHeader no_key;  // chunk 3, whose key never came
  no_key.chunk = 3;
  raw(2, with(2, &no_key, sizeof no_key));
  UcxLentHeader short_key;  // says 8 B of key, none follow
  short_key.key_bytes = 8;
  raw(3, with(3, &short_key, sizeof short_key));
  const char* expected[] = {"neither an announcement", "magic", "whose key never came",
                            "8 B of key, 0 B came"};
  for (uint64_t i = 0; i < 4; ++i) {
    auto t = e.recv->receive(e.announcement(i));
    REQUIRE_FALSE(t.ok());
    CHECK_MESSAGE(contains(t.error().message, expected[i]), t.error().message);
    CHECK(contains(t.error().message, "UCX channel 0 (0 -> 1)"));
  }
}
