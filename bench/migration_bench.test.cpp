// Tests of `actorpipe-bench migration`'s command line: defaults, every option, and errors that
// name the option, the value and what is allowed.
#include "bench/migration_bench.hpp"

#include <doctest/doctest.h>

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {

std::string error_of(std::vector<std::string> args) {
  auto r = parse_migration_options(args);
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

}  // namespace

TEST_CASE("migration bench defaults: small, 1f1b and 2bw, both scenarios, m = 4, 12 steps") {
  auto o = parse_migration_options({});
  REQUIRE(o.ok());
  CHECK(o->shape == "small");
  CHECK(o->modes == std::vector<Mode>{Mode::onef1b, Mode::twobw});
  CHECK(o->scenarios == std::vector<std::string>{"bad", "slow"});
  CHECK(o->microbatches == 4);
  CHECK(o->steps == 12);
  CHECK(o->check_every == 2);
  CHECK(o->slowdown == 2.0);
  CHECK(o->slow_from == 4);
  CHECK(o->repeats == 2);
}

TEST_CASE("migration bench options") {
  const std::vector<std::string> args = {
      "--shape",   "tiny", "--modes",       "gpipe", "--scenarios", "slow", "--microbatches", "2",
      "--steps",   "9",    "--check-every", "3",     "--slowdown",  "1.5",  "--slow-from",    "5",
      "--repeats", "3",    "--json"};
  auto o = parse_migration_options(args);
  REQUIRE_MESSAGE(o.ok(), (o.ok() ? "" : o.error().message));
  CHECK(o->shape == "tiny");
  CHECK(o->modes == std::vector<Mode>{Mode::gpipe});
  CHECK(o->scenarios == std::vector<std::string>{"slow"});
  CHECK(o->microbatches == 2);
  CHECK(o->steps == 9);
  CHECK(o->check_every == 3);
  CHECK(o->slowdown == 1.5);
  CHECK(o->slow_from == 5);
  CHECK(o->repeats == 3);
  CHECK(o->json);
}

TEST_CASE("migration bench errors name the option and the value") {
  CHECK(error_of({"--shape", "huge"}).find("--shape: ") == 0);
  CHECK(error_of({"--scenarios", "bad,worse"}).find("\"worse\" is not a scenario") !=
        std::string::npos);
  CHECK(error_of({"--scenarios", "bad,bad"}).find("\"bad\" given twice") != std::string::npos);
  CHECK(error_of({"--slowdown", "1"}).find("--slowdown 1: expected a number in (1, 100]") !=
        std::string::npos);
  CHECK(error_of({"--slowdown", "x"}).find("--slowdown x") != std::string::npos);
  CHECK(error_of({"--slow-from", "12"}).find("--slow-from 12: must be before --steps 12") !=
        std::string::npos);
  CHECK(error_of({"--modes", "2bw", "--microbatches", "1"}).find("2bw needs at least 2") !=
        std::string::npos);
  CHECK(error_of({"--steps", "0"}).find("--steps") != std::string::npos);
  CHECK(error_of({"--frobnicate"}).find("unknown option --frobnicate") != std::string::npos);
}
