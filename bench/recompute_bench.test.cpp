// Tests of `actorpipe-bench recompute`'s command line: defaults, every option, and errors that
// name the option, the value and what is allowed.
#include "bench/recompute_bench.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "bench/stash_bench.hpp"

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {

Expected<RecomputeBenchOptions> parse(std::vector<std::string> args) {
  return parse_recompute_options(args);
}

std::string error_of(std::vector<std::string> args) {
  auto r = parse(std::move(args));
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

}  // namespace

TEST_CASE("defaults: small, gpipe on 2 stages, m = 4, 3 reps after 1, 3 rounds, limit derived") {
  auto o = parse({});
  REQUIRE(o.ok());
  CHECK(o->shape == "small");
  CHECK(o->mode == Mode::gpipe);
  CHECK(o->stages == 2);
  CHECK(o->microbatches == 4);
  CHECK(o->threads == 1);
  CHECK(o->reps == 3);
  CHECK(o->warmup == 1);
  CHECK(o->rounds == 3);
  CHECK(o->limit_mb == 0);
  CHECK(o->profile_reps == 3);
  CHECK(o->cache_dir.empty());
  CHECK(o->child.empty());
  CHECK_FALSE(o->json);
}

TEST_CASE("options") {
  auto o = parse({"--shape",        "tiny", "--mode",      "1f1b", "--stages",   "3",
                  "--microbatches", "6",    "--threads",   "2",    "--reps",     "2",
                  "--warmup",       "2",    "--rounds",    "5",    "--limit-mb", "40",
                  "--profile-reps", "1",    "--cache-dir", "c",    "--child",    "1,3",
                  "--json"});
  REQUIRE_MESSAGE(o.ok(), (o.ok() ? "" : o.error().message));
  CHECK(o->shape == "tiny");
  CHECK(o->mode == Mode::onef1b);
  CHECK(o->stages == 3);
  CHECK(o->microbatches == 6);
  CHECK(o->threads == 2);
  CHECK(o->reps == 2);
  CHECK(o->warmup == 2);
  CHECK(o->rounds == 5);
  CHECK(o->limit_mb == 40);
  CHECK(o->profile_reps == 1);
  CHECK(o->cache_dir == "c");
  CHECK(o->child == "1,3");
  CHECK(o->json);
  CHECK(parse({"--child", "all"})->child == "all");
  CHECK(parse({"--child", "none"})->child == "none");
  CHECK(parse({"--help"})->help);
  auto b = parse({"--mode", "2bw", "--precision", "bf16", "--stash-precision", "bf16"});
  REQUIRE_MESSAGE(b.ok(), (b.ok() ? "" : b.error().message));
  CHECK(b->precision == "bf16");
  CHECK(b->stash_precision == "bf16");
}

TEST_CASE("errors name the option, the value and what is allowed") {
  CHECK(error_of({"--shape", "huge"}).find("--shape: ") == 0);
  CHECK(error_of({"--mode", "zb"}).find("--mode: ") == 0);
  CHECK(error_of({"--rounds", "0"}).find("--rounds") != std::string::npos);
  CHECK(error_of({"--limit-mb", "-1"}).find("--limit-mb") != std::string::npos);
  CHECK(error_of({"--child", "some"}).find("--child") != std::string::npos);
  CHECK(error_of({"--cache-dir", ""}) == "--cache-dir: needs a directory");
  CHECK(error_of({"--precision", "fp16"}) == "--precision fp16: expected fp32 or bf16");
  // the config's own check names the keys
  CHECK(error_of({"--stash-precision", "bf16"}).find("pipeline.stash_precision") == 0);
  CHECK(error_of({"--stages"}).find("--stages") != std::string::npos);
  CHECK(error_of({"--frobnicate"}) ==
        "unknown option '--frobnicate' (see actorpipe-bench recompute --help)");
  // the config's own checks: 2bw needs m >= d, at most depth + 2 stages
  CHECK(error_of({"--mode", "2bw", "--stages", "4", "--microbatches", "2"})
            .find("pipeline.microbatches = 2: mode 2bw needs") == 0);
  CHECK(error_of({"--shape", "tiny", "--stages", "7"}).find("pipeline.stages = 7") == 0);
}

TEST_CASE("actorpipe-bench stash: 2bw in bf16 by default, fp32 compute and --child refused") {
  auto o = parse_stash_options(std::vector<std::string>{});
  REQUIRE_MESSAGE(o.ok(), (o.ok() ? "" : o.error().message));
  CHECK(o->mode == Mode::twobw);
  CHECK(o->precision == "bf16");
  CHECK(parse_stash_options(std::vector<std::string>{"--mode", "pipedream"})->mode ==
        Mode::pipedream);
  auto gpipe = parse_stash_options(std::vector<std::string>{"--mode", "gpipe"});
  REQUIRE_FALSE(gpipe.ok());
  CHECK(gpipe.error().message.find("pipeline.mode = \"gpipe\" keeps no weight version") !=
        std::string::npos);
  auto f32 = parse_stash_options(std::vector<std::string>{"--precision", "fp32"});
  REQUIRE_FALSE(f32.ok());
  CHECK(f32.error().message.find("needs pipeline.precision = \"bf16\"") != std::string::npos);
  auto both = parse_stash_options(
      std::vector<std::string>{"--precision", "fp32", "--stash-precision", "fp32"});
  REQUIRE_FALSE(both.ok());
  CHECK(both.error().message.find("--precision fp32") == 0);
  CHECK_FALSE(parse_stash_options(std::vector<std::string>{"--child", "none"}).ok());
}
