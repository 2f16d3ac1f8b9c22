// Gloo group tests: members as threads of this process meeting through an in-memory exchange;
// sums bitwise equal to the serial loop in member order, lengths, reuse, two groups, timeouts.
#include "transport/gloo_group.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace actorpipe;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

template <class T>
std::string why(const Expected<T>& e) {
  return e.ok() ? std::string() : e.error().message;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

/// The in-memory AllGatherText of `size` members: each call waits (at most `limit`) until every
/// member gave its text, then returns them all. One round: each member calls it once.
class MemoryExchange {
 public:
  explicit MemoryExchange(int size, std::chrono::milliseconds limit = 10s)
      : texts_(size), limit_(limit) {}

  AllGatherText member(int rank) {
    return [this, rank](std::string mine) -> Expected<std::vector<std::string>> {
      std::unique_lock<std::mutex> lock(mu_);
      texts_[rank] = std::move(mine);
      ++given_;
      cv_.notify_all();
      if (!cv_.wait_for(lock, limit_, [&] { return given_ == static_cast<int>(texts_.size()); }))
        return make_error("in-memory exchange: {} of {} members came within {} ms", given_,
                          texts_.size(), limit_.count());
      std::vector<std::string> all;
      for (const auto& t : texts_) all.push_back(*t);
      return all;
    };
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::optional<std::string>> texts_;
  int given_ = 0;
  std::chrono::milliseconds limit_;
};

/// Runs fn(0), ..., fn(n-1) on n threads and joins them all.
void run_members(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

/// A connected group of `size` members (index = rank).
std::vector<std::unique_ptr<GlooGroup>> connect_group(int size, const std::string& name,
                                                      std::chrono::milliseconds timeout = 10s) {
  MemoryExchange exchange(size);
  std::vector<std::unique_ptr<GlooGroup>> groups(size);
  std::vector<std::string> errors(size);
  run_members(size, [&](int r) {
    GlooGroupOptions o;
    o.rank = r;
    o.size = size;
    o.timeout = timeout;
    o.name = name;
    auto g = GlooGroup::connect(o, exchange.member(r));
    if (g) {
      groups[r] = std::move(*g);
    } else {
      errors[r] = g.error().message;
    }
  });
  for (int r = 0; r < size; ++r) REQUIRE_MESSAGE(groups[r] != nullptr, errors[r]);
  return groups;
}

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Member r's element i. Even i: member 0 holds a large B (not a power of two), the others small
/// values s of one sign with |s| in [0.375, 0.47] ulp(B), so B + s rounds back to B while two or
/// three smalls added before B move it by an ulp: any order that does not start from member 0's
/// value and add the others one by one to it (reversed, a tree, a ring's rotated order) gives
/// other bits. Odd i: a sign, a magnitude from 2^0 to 2^27 and a full mantissa, so that a member
/// left out or counted twice shows in the bits.
float value(int r, size_t i, uint64_t seed = 0) {
  const uint64_t h = splitmix(seed * 1000003 + static_cast<uint64_t>(r) * 0x100000001ull + i);
  if (i % 2 == 0) {
    const uint64_t e = splitmix(seed * 1000003 + i + 0x5555);  // the element's, for every member
    const int exponent = static_cast<int>(e % 24);
    const float sign = (e >> 40) & 1 ? -1.0f : 1.0f;
    if (r == 0) {
      const float mantissa = 1.0f + static_cast<float>(1 + (e >> 8) % 0x7FFFFE) / 8388608.0f;
      return sign * std::ldexp(mantissa, exponent);
    }
    const float small_sign = (e >> 41) & 1 ? -1.0f : 1.0f;
    return small_sign * std::ldexp(0.375f + 0.03125f * static_cast<float>(h % 4), exponent - 23);
  }
  const float mantissa = 1.0f + static_cast<float>(h & 0xFFFFFF) / 16777216.0f;
  const int exponent = static_cast<int>((h >> 24) % 28);
  const float sign = (h >> 40) & 1 ? -1.0f : 1.0f;
  return sign * std::ldexp(mantissa, exponent);
}

std::vector<std::vector<float>> inputs(int size, size_t n, uint64_t seed = 0) {
  std::vector<std::vector<float>> in(size, std::vector<float>(n));
  for (int r = 0; r < size; ++r)
    for (size_t i = 0; i < n; ++i) in[r][i] = value(r, i, seed);
  return in;
}

/// The serial loop all_reduce_sum must equal: ((d0 + d1) + d2) + ...
std::vector<float> ordered_sum(const std::vector<std::vector<float>>& in) {
  std::vector<float> out = in[0];
  for (size_t r = 1; r < in.size(); ++r)
    for (size_t i = 0; i < out.size(); ++i) out[i] += in[r][i];
  return out;
}

/// The same sum in reversed member order: ((d_{p-1} + d_{p-2}) + ...) + d0.
std::vector<float> reversed_sum(const std::vector<std::vector<float>>& in) {
  std::vector<float> out = in.back();
  for (size_t r = in.size() - 1; r-- > 0;)
    for (size_t i = 0; i < out.size(); ++i) out[i] += in[r][i];
  return out;
}

size_t differing_bits(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  size_t d = 0;
  for (size_t i = 0; i < a.size(); ++i)
    d += std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i]) ? 1 : 0;
  return d;
}

/// Every member of `groups` sums `in` (in[r] its data); returns what each member got.
std::vector<std::vector<float>> all_reduce(std::vector<std::unique_ptr<GlooGroup>>& groups,
                                           std::vector<std::vector<float>> in) {
  std::vector<std::string> errors(groups.size());
  run_members(static_cast<int>(groups.size()), [&](int r) {
    auto s = groups[r]->all_reduce_sum(in[r]);
    if (!s) errors[r] = s.error().message;
  });
  for (const auto& e : errors) REQUIRE_MESSAGE(e.empty(), e);
  return in;
}

void check_bitwise(int size, size_t n, uint64_t seed = 0) {
  auto groups = connect_group(size, fmt::format("group of {}", size));
  const auto in = inputs(size, n, seed);
  const auto want = ordered_sum(in);
  const auto got = all_reduce(groups, in);
  for (int r = 0; r < size; ++r) {
    INFO("size ", size, ", n ", n, ", member ", r);
    CHECK(differing_bits(got[r], want) == 0);
  }
}

}  // namespace

TEST_CASE("the inputs tell the member order apart: reversed, the sums differ in their bits") {
  // Float addition is commutative, so two members give the same bits in either order; from three
  // on, a wrong order shows: in element 0 already, and in every even element.
  for (int size : {3, 4}) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{1000001}}) {
      CAPTURE(size);
      CAPTURE(n);
      const auto in = inputs(size, n);
      CHECK(differing_bits(ordered_sum(in), reversed_sum(in)) >= (n + 1) / 2);
      // and a member left out shows too
      auto fewer = in;
      fewer.pop_back();
      if (n > 1) CHECK(differing_bits(ordered_sum(in), ordered_sum(fewer)) >= n / 4);
    }
  }
  // the brief's example: ((1e8 + 3) + -1e8) + 3 = 3 but ((3 + -1e8) + 3) + 1e8 = 0
  const std::vector<std::vector<float>> example = {{1e8f}, {3.0f}, {-1e8f}, {3.0f}};
  CHECK(ordered_sum(example)[0] == 3.0f);
  CHECK(reversed_sum(example)[0] == 0.0f);
}

TEST_CASE("a group of one sums nothing, sends nothing and still calls the exchange once") {
  int calls = 0;
  AllGatherText exchange = [&](std::string mine) -> Expected<std::vector<std::string>> {
    ++calls;
    return std::vector<std::string>{std::move(mine)};
  };
  GlooGroupOptions o;
  o.name = "alone";
  auto g = GlooGroup::connect(o, exchange);
  REQUIRE_MESSAGE(g.ok(), why(g));
  CHECK(calls == 1);
  CHECK((*g)->rank() == 0);
  CHECK((*g)->size() == 1);
  std::vector<float> data = {1.5f, -2.0f, 3e-8f};
  const auto before = data;
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}}) {
    CHECK((*g)->all_reduce_sum(std::span<float>(data.data(), n)).ok());
  }
  CHECK(differing_bits(data, before) == 0);
  CHECK((*g)->bytes_sent() == 0);
}

TEST_CASE("two, three and four members: lengths 0, 1, 7 and 1000001, bitwise the ordered loop") {
  for (int size : {2, 3, 4}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000001}}) {
      CAPTURE(size);
      CAPTURE(n);
      check_bitwise(size, n);
    }
  }
}

TEST_CASE("one group sums many times, with lengths that change, and counts its bytes") {
  const int size = 3;
  auto groups = connect_group(size, "reused group");
  int64_t expected_bytes = 0;
  uint64_t seed = 1;
  for (size_t n : {size_t{7}, size_t{100000}, size_t{1}, size_t{0}, size_t{33334}, size_t{7},
                   size_t{7}, size_t{2}, size_t{100000}}) {
    CAPTURE(n);
    const auto in = inputs(size, n, seed++);
    const auto want = ordered_sum(in);
    const auto got = all_reduce(groups, in);
    for (int r = 0; r < size; ++r) CHECK(differing_bits(got[r], want) == 0);
    const int64_t c = static_cast<int64_t>((n + size - 1) / size);
    expected_bytes += n == 0 ? 0 : 2 * (size - 1) * c * static_cast<int64_t>(sizeof(float));
    for (int r = 0; r < size; ++r) CHECK(groups[r]->bytes_sent() == expected_bytes);
  }
}

TEST_CASE("two groups of one process sum at the same time without mixing their data") {
  // the two groups connect at the same time too
  std::vector<std::unique_ptr<GlooGroup>> a, b;
  std::thread ta([&] { a = connect_group(2, "group a"); });
  std::thread tb([&] { b = connect_group(3, "group b"); });
  ta.join();
  tb.join();
  REQUIRE(a.size() == 2);
  REQUIRE(b.size() == 3);
  std::vector<std::vector<float>> want_a, want_b, got_a, got_b;
  const auto in_a = inputs(2, 50001, 11);
  const auto in_b = inputs(3, 50001, 12);
  for (int round = 0; round < 3; ++round) {
    std::thread ra([&] { got_a = all_reduce(a, in_a); });
    std::thread rb([&] { got_b = all_reduce(b, in_b); });
    ra.join();
    rb.join();
    for (const auto& g : got_a) CHECK(differing_bits(g, ordered_sum(in_a)) == 0);
    for (const auto& g : got_b) CHECK(differing_bits(g, ordered_sum(in_b)) == 0);
  }
}

TEST_CASE("a member that never sums: the others fail within the timeout, naming group and rank") {
  const int size = 3;
  auto groups = connect_group(size, "stage 1's replicas", 1000ms);
  std::vector<std::string> errors(size);
  std::vector<double> seconds(size);
  std::vector<std::string> later(size);
  std::mutex mu;
  std::condition_variable cv;
  int others_done = 0;
  run_members(size, [&](int r) {
    if (r == 2) {
      // stays connected (so the others wait for it, not for a closed connection) but never
      // calls; leaves once both others returned, or after 10 s at most
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, 10s, [&] { return others_done == 2; });
      return;
    }
    std::vector<float> data(1000, 1.0f);
    const auto t0 = Clock::now();
    auto s = groups[r]->all_reduce_sum(data);
    seconds[r] = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!s) errors[r] = s.error().message;
    auto again = groups[r]->all_reduce_sum(data);
    if (!again) later[r] = again.error().message;
    std::lock_guard<std::mutex> lock(mu);
    ++others_done;
    cv.notify_all();
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    INFO(errors[r]);
    CHECK(contains(errors[r], "stage 1's replicas"));
    CHECK(contains(errors[r], fmt::format("rank {} of 3", r)));
    CHECK(seconds[r] < 5.0);
    CHECK(contains(later[r], "unusable after an earlier error"));
    CHECK(contains(later[r], fmt::format("rank {} of 3", r)));
  }
}

TEST_CASE("a member that is gone: the other's next sum fails at once, naming group and rank") {
  auto groups = connect_group(2, "pair of replicas", 10000ms);
  groups[1].reset();  // closes its connection
  std::vector<float> data(100, 1.0f);
  const auto t0 = Clock::now();
  auto s = groups[0]->all_reduce_sum(data);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  REQUIRE_FALSE(s.ok());
  INFO(s.error().message);
  CHECK(contains(s.error().message, "pair of replicas: rank 0 of 2"));
  CHECK(seconds < 5.0);
  CHECK(data == std::vector<float>(100, 1.0f));  // left as it was
}

TEST_CASE("connect reports bad options and a failed or malformed exchange, naming the group") {
  auto never = [](std::string) -> Expected<std::vector<std::string>> {
    return make_error("the coordinator is gone");
  };
  GlooGroupOptions o;
  o.name = "replicas of stage 3";
  o.size = 2;
  o.rank = 2;
  auto bad_rank = GlooGroup::connect(o, never);
  REQUIRE_FALSE(bad_rank.ok());
  CHECK(contains(why(bad_rank), "replicas of stage 3"));
  CHECK(contains(why(bad_rank), "outside 0 .. 1"));

  o.rank = 1;
  auto failed = GlooGroup::connect(o, never);
  REQUIRE_FALSE(failed.ok());
  CHECK(contains(why(failed), "replicas of stage 3: rank 1 of 2"));
  CHECK(contains(why(failed), "the coordinator is gone"));

  auto too_few = GlooGroup::connect(o, [](std::string mine) -> Expected<std::vector<std::string>> {
    return std::vector<std::string>{mine};
  });
  REQUIRE_FALSE(too_few.ok());
  CHECK(contains(why(too_few), "returned 1 texts"));

  auto garbled = GlooGroup::connect(o, [](std::string mine) -> Expected<std::vector<std::string>> {
    return std::vector<std::string>{"hello", mine};
  });
  REQUIRE_FALSE(garbled.ok());
  CHECK(contains(why(garbled), "member 0's text does not start with"));

  o.timeout = 0ms;
  auto no_time = GlooGroup::connect(o, never);
  REQUIRE_FALSE(no_time.ok());
  CHECK(contains(why(no_time), "not positive"));
}
