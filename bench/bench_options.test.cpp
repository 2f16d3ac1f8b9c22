// Command-line tests: defaults, lists, and errors that name the option and the value.
#include "bench/bench_options.hpp"

#include <doctest/doctest.h>

using namespace actorpipe::bench;

namespace {
actorpipe::Expected<BenchOptions> parse(std::vector<std::string> args) {
  return parse_bench_options(args);
}
bool error_has(const actorpipe::Expected<BenchOptions>& r, const std::string& what) {
  return !r.ok() && r.error().message.find(what) != std::string::npos;
}
}  // namespace

TEST_CASE("defaults measure every shape at 1 and 2 threads with the peer") {
  auto o = parse({});
  REQUIRE(o.ok());
  CHECK(o->shapes == std::vector<std::string>{"tiny", "small", "gpt2"});
  CHECK(o->threads == std::vector<int>{1, 2});
  CHECK(o->precisions == std::vector<std::string>{"fp32", "bf16"});
  CHECK(o->reps == 5);
  CHECK(o->warmup == 1);
  CHECK(o->peer);
  CHECK_FALSE(o->json);
  CHECK_FALSE(o->profile);
  CHECK_FALSE(o->child);
}

TEST_CASE("lists and flags") {
  auto o =
      parse({"--shapes", "gpt2,tiny", "--threads", "2", "--reps", "3", "--warmup", "2", "--no-peer",
             "--json", "--profile", "--python", "/opt/py", "--peer-script", "/x/y.py"});
  REQUIRE(o.ok());
  CHECK(o->shapes == std::vector<std::string>{"gpt2", "tiny"});
  CHECK(o->threads == std::vector<int>{2});
  CHECK(o->reps == 3);
  CHECK(o->warmup == 2);
  CHECK_FALSE(o->peer);
  CHECK(o->json);
  CHECK(o->profile);
  CHECK(o->python == "/opt/py");
  CHECK(o->peer_script == "/x/y.py");
}

TEST_CASE("--precision picks what the products compute in") {
  auto o = parse({"--precision", "bf16"});
  REQUIRE(o.ok());
  CHECK(o->precisions == std::vector<std::string>{"bf16"});
  CHECK(error_has(parse({"--precision", "fp32,fp16"}),
                  "--precision fp32,fp16: unknown precision 'fp16' (allowed: fp32, bf16)"));
}

TEST_CASE("errors name the option, the value and what is allowed") {
  CHECK(error_has(parse({"--shapes", "tiny,huge"}), "'huge'"));
  CHECK(error_has(parse({"--shapes", "tiny,huge"}), "tiny, small, gpt2"));
  CHECK(error_has(parse({"--shapes", "tiny,"}), "unknown shape ''"));
  CHECK(error_has(parse({"--threads", "0"}), "--threads: '0' is not an integer in [1, 256]"));
  CHECK(error_has(parse({"--threads", "1,x"}), "'x'"));
  CHECK(error_has(parse({"--reps", "2.5"}), "--reps: '2.5'"));
  CHECK(error_has(parse({"--warmup", "0"}), "--warmup: '0'"));
  CHECK(error_has(parse({"--reps"}), "--reps: missing value"));
  CHECK(error_has(parse({"--fast"}), "unknown option '--fast'"));
}
