// Tests of `actorpipe-bench processes`'s command line: defaults, every option, and errors that
// name the option, the value and what is allowed.
#include "bench/process_bench.hpp"

#include <doctest/doctest.h>

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {

Expected<ProcessBenchOptions> parse(std::vector<std::string> args) {
  return parse_process_options(args);
}

std::string error_of(std::vector<std::string> args) {
  auto r = parse(std::move(args));
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

}  // namespace

TEST_CASE("defaults: small, all five modes, m = 8, 3 reps after 1, 2 repeats, 100 overhead steps") {
  auto o = parse({});
  REQUIRE(o.ok());
  CHECK(o->shape == "small");
  CHECK(o->modes.size() == 5);
  CHECK(o->microbatches == 8);
  CHECK(o->reps == 3);
  CHECK(o->warmup == 1);
  CHECK(o->repeats == 2);
  CHECK(o->partition.empty());
  CHECK(o->overhead_steps == 100);
  CHECK(o->training);
  CHECK(o->rank_child.empty());
}

TEST_CASE("options") {
  auto o = parse({"--shape", "tiny", "--modes", "2bw,gpipe", "--microbatches", "4", "--reps", "2",
                  "--warmup", "2", "--repeats", "3", "--partition", "4,2", "--overhead-steps", "7",
                  "--json"});
  REQUIRE(o.ok());
  CHECK(o->shape == "tiny");
  CHECK(o->modes == std::vector<Mode>{Mode::twobw, Mode::gpipe});
  CHECK(o->microbatches == 4);
  CHECK(o->reps == 2);
  CHECK(o->warmup == 2);
  CHECK(o->repeats == 3);
  CHECK(o->partition == std::vector<int>{4, 2});
  CHECK(o->overhead_steps == 7);
  CHECK(o->json);
  auto child = parse({"--rank-child", "ranks", "--mode", "xpipe", "--skip-compute"});
  REQUIRE(child.ok());
  CHECK(child->rank_child == "ranks");
  CHECK(child->mode == Mode::xpipe);
  CHECK(child->skip_compute);
}

TEST_CASE("bad options name the option, the value and what is allowed") {
  CHECK(error_of({"--shape", "huge"}).find("--shape") == 0);
  CHECK(error_of({"--modes", "gpipe,gpipe"}) == "--modes: 'gpipe' is listed twice");
  CHECK(error_of({"--partition", "1,2,3"}) ==
        "--partition: 3 counts given, expected 2 (stage 0, stage 1)");
  CHECK(error_of({"--no-training", "--overhead-steps", "0"}) ==
        "--no-training with --overhead-steps 0 measures nothing: drop one of them");
  CHECK(error_of({"--modes", "2bw", "--microbatches", "1"}) ==
        "--microbatches 1: 2bw needs at least 2 on two stages");
  CHECK(error_of({"--rank-child", "x"}) ==
        "--rank-child: 'x' is not allowed: expected local or ranks");
  CHECK(error_of({"--bogus"}) == "unknown option '--bogus' (see actorpipe-bench processes --help)");
}
