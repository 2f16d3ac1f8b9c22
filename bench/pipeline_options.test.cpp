// Tests of `actorpipe-bench pipeline`'s command line: defaults, every option, and errors that
// name the option, the value and what is allowed.
#include "bench/pipeline_options.hpp"

#include <doctest/doctest.h>

using namespace actorpipe;
using namespace actorpipe::bench;

namespace {

Expected<PipelineBenchOptions> parse(std::vector<std::string> args) {
  return parse_pipeline_options(args);
}

std::string error_of(std::vector<std::string> args) {
  auto r = parse(std::move(args));
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

}  // namespace

TEST_CASE("defaults: small, all five modes, m = 8, 3 reps after 1, peer on, table") {
  auto o = parse({});
  REQUIRE(o.ok());
  CHECK(o->shape == "small");
  CHECK(o->modes ==
        std::vector<Mode>{Mode::gpipe, Mode::onef1b, Mode::twobw, Mode::pipedream, Mode::xpipe});
  CHECK(o->microbatches == 8);
  CHECK(o->reps == 3);
  CHECK(o->warmup == 1);
  CHECK_FALSE(o->warmup_given);
  CHECK(correction_warmup(*o) == kCorrectionWarmup);
  CHECK(o->partition.empty());
  CHECK(o->overhead_steps == 100);
  CHECK_FALSE(o->overhead_only);
  CHECK(o->profile_reps == 3);
  CHECK(o->peer);
  CHECK_FALSE(o->json);
  CHECK_FALSE(o->help);
  CHECK(o->python == "/usr/bin/python3");
  CHECK(o->peer_script.empty());
}

TEST_CASE("every option is read") {
  auto o = parse(
      {"--shape",          "tiny",    "--modes",        "xpipe,gpipe", "--microbatches", "4",
       "--reps",           "2",       "--warmup",       "3",           "--partition",    "4,2",
       "--overhead-steps", "0",       "--profile-reps", "5",           "--no-peer",      "--json",
       "--python",         "/bin/py", "--peer-script",  "p.py",        "--help"});
  REQUIRE_MESSAGE(o.ok(), (o.ok() ? "" : o.error().message));
  CHECK(o->shape == "tiny");
  CHECK(o->modes == std::vector<Mode>{Mode::xpipe, Mode::gpipe});
  CHECK(o->microbatches == 4);
  CHECK(o->reps == 2);
  CHECK(o->warmup == 3);
  CHECK(o->warmup_given);
  CHECK(o->partition == std::vector<int>{4, 2});
  CHECK(o->overhead_steps == 0);
  CHECK(o->profile_reps == 5);
  CHECK_FALSE(o->peer);
  CHECK(o->json);
  CHECK(o->python == "/bin/py");
  CHECK(o->peer_script == "p.py");
  CHECK(o->help);
}

TEST_CASE("errors name the option, the value and what is allowed") {
  std::string e = error_of({"--shape", "huge"});
  CHECK(e.find("--shape") != std::string::npos);
  CHECK(e.find("'huge'") != std::string::npos);
  CHECK(e.find("tiny, small, gpt2") != std::string::npos);

  e = error_of({"--modes", "1f1b,zb"});
  CHECK(e.find("--modes") != std::string::npos);
  CHECK(e.find("'zb'") != std::string::npos);
  CHECK(e.find("pipedream") != std::string::npos);

  e = error_of({"--modes", "2bw,1f1b,2bw"});
  CHECK(e.find("'2bw' is listed twice") != std::string::npos);

  e = error_of({"--modes", ""});
  CHECK(e.find("--modes") != std::string::npos);

  e = error_of({"--microbatches", "0"});
  CHECK(e.find("--microbatches: '0' is not an integer in [1, 100000]") != std::string::npos);

  e = error_of({"--reps", "two"});
  CHECK(e.find("--reps: 'two'") != std::string::npos);

  e = error_of({"--overhead-steps", "-1"});
  CHECK(e.find("--overhead-steps: '-1' is not an integer in [0, 1000000]") != std::string::npos);

  e = error_of({"--partition", "3,2,1"});
  CHECK(e.find("--partition: '3,2,1' has 3 counts, expected 2") != std::string::npos);

  e = error_of({"--partition", "3,0"});
  CHECK(e.find("--partition: '0'") != std::string::npos);

  e = error_of({"--microbatches", "1"});
  CHECK(e.find("--microbatches 1: 2bw needs at least 2") != std::string::npos);
  CHECK(parse({"--microbatches", "1", "--modes", "gpipe,1f1b,pipedream,xpipe"}).ok());

  e = error_of({"--warmup"});
  CHECK(e.find("--warmup: missing value") != std::string::npos);

  e = error_of({"--overhead-only", "--overhead-steps", "0"});
  CHECK(e.find("--overhead-only with --overhead-steps 0 measures nothing") != std::string::npos);
  auto only = parse({"--overhead-only"});
  REQUIRE(only.ok());
  CHECK(only->overhead_only);

  e = error_of(
      {"--only-corrections", "rot32", "--corrections", "1", "--only-corrections", "rot32,rot16"});
  CHECK(e.find("--only-corrections: unknown correction 'rot16' in 'rot32,rot16'") !=
        std::string::npos);
  CHECK(e.find("rot32+nesterov") != std::string::npos);  // the known ones listed
  e = error_of({"--corrections", "1", "--only-corrections", "rot32,nesterov,rot32"});
  CHECK(e.find("'rot32' is listed twice") != std::string::npos);
  e = error_of({"--corrections", "1", "--only-corrections", ""});
  CHECK(e.find("unknown correction ''") != std::string::npos);
  e = error_of({"--only-corrections", "rot32"});
  CHECK(e.find("--only-corrections without --corrections N measures nothing") != std::string::npos);
  auto chosen = parse({"--corrections", "2", "--only-corrections", "rot32+nesterov,dc"});
  REQUIRE(chosen.ok());
  CHECK(chosen->correction_rounds == 2);
  CHECK(chosen->only_corrections == std::vector<std::string>{"rot32+nesterov", "dc"});
  CHECK(parse({"--corrections", "1"})->only_corrections.empty());

  e = error_of({"--shapes", "tiny"});
  CHECK(e.find("unknown option '--shapes'") != std::string::npos);
}

TEST_CASE("the help text lists every option") {
  const std::string u = pipeline_usage();
  for (const char* opt :
       {"--shape", "--modes", "--microbatches", "--reps", "--warmup", "--partition",
        "--overhead-steps", "--overhead-only", "--profile-reps", "--corrections",
        "--only-corrections", "--precisions", "--no-peer", "--json", "--python", "--peer-script"})
    CHECK_MESSAGE(u.find(opt) != std::string::npos, opt);
}

TEST_CASE("the correction rows warm up with three steps unless --warmup says otherwise") {
  CHECK(kCorrectionWarmup == 3);
  auto given = parse({"--warmup", "1", "--corrections", "2"});
  REQUIRE(given.ok());
  CHECK(correction_warmup(*given) == 1);  // the smoke test's one step stays one
  auto more = parse({"--warmup", "5"});
  REQUIRE(more.ok());
  CHECK(correction_warmup(*more) == 5);
  auto unset = parse({"--corrections", "2"});
  REQUIRE(unset.ok());
  CHECK(unset->warmup == 1);  // the main table's runs keep one
  CHECK(correction_warmup(*unset) == 3);
}
