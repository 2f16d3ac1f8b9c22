// Tests of `actorpipe-bench channel`'s parts that need no second process: the command line, the
// message counts and reading ucx_perftest's result line.
#include "bench/channel_bench.hpp"

#include <doctest/doctest.h>

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {

Expected<ChannelBenchOptions> parse(std::vector<std::string> args) {
  return parse_channel_options(args);
}

std::string error_of(std::vector<std::string> args) {
  auto r = parse(std::move(args));
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

// What ucx_perftest 1.13 printed for tag_bw of 3 MiB on this machine (its table's last lines).
constexpr const char* kPerftestOutput =
    R"(+--------------+--------------+------------------------------+---------------------+-----------------------+
|              |              |       overhead (usec)        |   bandwidth (MB/s)  |  message rate (msg/s) |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
Final:                   200      0.170   605.226   605.226     4956.83    4956.83        1652        1652
)";

}  // namespace

TEST_CASE("defaults: 8 B, 64 KiB, 3 MiB and 64 MiB over sm and tcp, 3 reps, 5 rounds") {
  auto o = parse({});
  REQUIRE(o.ok());
  CHECK(o->sizes == std::vector<int64_t>{8, 65536, 3145728, 67108864});
  CHECK(o->transports == std::vector<std::string>{"sm", "tcp"});
  CHECK(o->reps == 3);
  CHECK(o->repeats == 5);
  CHECK(o->idle_seconds == 2.0);
  CHECK(o->peer);
  CHECK(o->rank_child.empty());
}

TEST_CASE("options: sizes, transports, reps, repeats, idle seconds, scale, no peer, json") {
  auto o = parse({"--sizes", "4,1024", "--transports", "posix", "--reps", "2", "--repeats", "4",
                  "--idle-seconds", "0.5", "--scale", "0.01", "--no-peer", "--json"});
  REQUIRE(o.ok());
  CHECK(o->sizes == std::vector<int64_t>{4, 1024});
  CHECK(o->transports == std::vector<std::string>{"posix"});
  CHECK(o->reps == 2);
  CHECK(o->repeats == 4);
  CHECK(o->idle_seconds == 0.5);
  CHECK(o->scale == 0.01);
  CHECK_FALSE(o->peer);
  CHECK(o->json);
}

TEST_CASE("bad options name the option, the value and what is allowed") {
  CHECK(error_of({"--sizes", "6"}) ==
        "--sizes: 6 is not a multiple of 4 (the payloads are f32 tensors)");
  CHECK(error_of({"--sizes", "0"}).find("--sizes") != std::string::npos);
  CHECK(error_of({"--transports", "sm,"}) == "--transports: '' is not a UCX_TLS value");
  CHECK(error_of({"--idle-seconds", "0"}) ==
        "--idle-seconds: '0' is not allowed: expected a number from 0.1 to 60");
  CHECK(error_of({"--scale", "x"}) ==
        "--scale: 'x' is not allowed: expected a number from 0.001 to 100");
  CHECK(error_of({"--bogus"}) == "unknown option '--bogus' (see actorpipe-bench channel --help)");
}

TEST_CASE("message counts shrink with the payload and scale, never below one") {
  const ChannelCounts small = channel_counts(8, 1.0);
  const ChannelCounts big = channel_counts(int64_t{64} << 20, 1.0);
  CHECK(small.round_trips > big.round_trips);
  CHECK(small.burst > big.burst);
  const ChannelCounts scaled = channel_counts(8, 0.01);
  CHECK(scaled.round_trips == small.round_trips / 100);
  CHECK(scaled.burst == small.burst / 100);
  const ChannelCounts tiny = channel_counts(int64_t{64} << 20, 0.001);
  CHECK(tiny.round_trips == 1);
  CHECK(tiny.burst == 1);
}

TEST_CASE("ucx_perftest's Final line: overall latency and messages per second times the size") {
  auto f = parse_perftest_final(kPerftestOutput, 3145728);
  REQUIRE(f.ok());
  CHECK(f->latency_us == doctest::Approx(605.226));
  CHECK(f->bytes_per_s == doctest::Approx(1652.0 * 3145728));
  // the MB/s column is in 2^20 bytes: the same figure within the table's rounding
  CHECK(f->bytes_per_s == doctest::Approx(4956.83 * 1048576).epsilon(0.001));
}

TEST_CASE("ucx_perftest output without a usable Final line is an error") {
  CHECK_FALSE(parse_perftest_final("server: connection refused\n", 8).ok());
  auto short_line = parse_perftest_final("Final:   200 0.1 0.2\n", 8);
  REQUIRE_FALSE(short_line.ok());
  CHECK(short_line.error().message.find("3 numbers, expected 8") != std::string::npos);
}
