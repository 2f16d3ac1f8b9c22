// `actorpipe-bench replicas` options: defaults, every option, and the errors naming the option.
#include "bench/replica_bench.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "bench/pipeline_timing.hpp"

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {

Expected<ReplicaBenchOptions> parse(std::vector<std::string> args) {
  return parse_replica_options(args);
}

}  // namespace

TEST_CASE("replicas bench: defaults and options") {
  auto d = parse({});
  REQUIRE(d.ok());
  CHECK(d->shape == "small");
  CHECK(d->mode == Mode::onef1b);
  CHECK(d->microbatches == 8);
  CHECK(d->repeats == 2);
  CHECK(d->allreduce_bandwidth == 0.0);
  auto o = parse({"--shape",
                  "tiny",
                  "--mode",
                  "2bw",
                  "--microbatches",
                  "4",
                  "--reps",
                  "2",
                  "--repeats",
                  "3",
                  "--profile-reps",
                  "1",
                  "--allreduce-bandwidth",
                  "1e9",
                  "--rank-child",
                  "ranks",
                  "--replicas",
                  "2",
                  "--stages",
                  "1",
                  "--partition",
                  "3,3",
                  "--json"});
  REQUIRE_MESSAGE(o.ok(), (o.ok() ? "" : o.error().message));
  CHECK(o->mode == Mode::twobw);
  CHECK(o->allreduce_bandwidth == 1e9);
  CHECK(o->rank_child == "ranks");
  CHECK(o->replicas == 2);
  CHECK(o->stages == 1);
  CHECK(o->partition == std::vector<int>{3, 3});
  CHECK(o->json);
  CHECK(replica_usage().find("--allreduce-bandwidth") != std::string::npos);
}

TEST_CASE("replicas bench: errors name the option") {
  auto check = [](std::vector<std::string> args, const std::string& part) {
    auto r = parse(args);
    REQUIRE_FALSE(r.ok());
    CHECK_MESSAGE(r.error().message.find(part) != std::string::npos, r.error().message);
  };
  check({"--mode", "xpipe"}, "--mode xpipe: runs no replicas");
  check({"--microbatches", "7"}, "--microbatches 7: two replicas need an even number");
  check({"--allreduce-bandwidth", "-3"}, "--allreduce-bandwidth: '-3' is not allowed");
  check({"--rank-child", "far"}, "--rank-child: 'far' is not allowed");
  check({"--frobnicate"}, "unknown option '--frobnicate'");
}

TEST_CASE("hidden_seconds: the all-reduce's overlap with the merged backward spans") {
  std::vector<ActionSpan> b(3);
  b[0].start = 0.0, b[0].end = 2.0;
  b[1].start = 1.0, b[1].end = 3.0;  // overlaps the first: counted once
  b[2].start = 5.0, b[2].end = 6.0;
  std::vector<ReduceSpan> r(2);
  r[0].start = 2.5, r[0].end = 5.5;  // 0.5 inside [0, 3], 0.5 inside [5, 6]
  r[1].start = 7.0, r[1].end = 8.0;  // after every backward
  CHECK(hidden_seconds(r, b) == doctest::Approx(1.0));
  CHECK(hidden_seconds({}, b) == 0.0);
}
