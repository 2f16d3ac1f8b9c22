// Command-line argument tests: comma lists, bounded integers and option values, with errors
// that name the option, the value and the range.
#include "bench/cli_args.hpp"

#include <doctest/doctest.h>

using namespace actorpipe::bench;

TEST_CASE("split_commas keeps empty entries") {
  CHECK(split_commas("a,b") == std::vector<std::string>{"a", "b"});
  CHECK(split_commas("a,,b") == std::vector<std::string>{"a", "", "b"});
  CHECK(split_commas("") == std::vector<std::string>{""});
  CHECK(split_commas("a,") == std::vector<std::string>{"a", ""});
}

TEST_CASE("parse_int accepts exactly an integer in range") {
  CHECK(*parse_int("--n", "7", 1, 10) == 7);
  CHECK(*parse_int("--n", "0", 0, 0) == 0);
  for (const char* bad : {"", "x", "7x", " 7", "0", "11", "-1", "1.5"}) {
    auto r = parse_int("--n", bad, 1, 10);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message == fmt::format("--n: '{}' is not an integer in [1, 10]", bad));
  }
}

TEST_CASE("parse_int_list parses every entry or names the bad one") {
  CHECK(*parse_int_list("--t", "1,2,4", 1, 8) == std::vector<int>{1, 2, 4});
  auto r = parse_int_list("--t", "1,,4", 1, 8);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message == "--t: '' is not an integer in [1, 8]");
  CHECK(parse_int_list("--t", "1,9", 1, 8).error().message ==
        "--t: '9' is not an integer in [1, 8]");
}

TEST_CASE("option values move the index onto the value") {
  const std::vector<std::string> args = {"--a", "3", "--b", "1,2", "--c"};
  size_t i = 0;
  CHECK(*int_option(args, i, 1, 5) == 3);
  CHECK(i == 1);
  i = 2;
  CHECK(*int_list_option(args, i, 1, 5) == std::vector<int>{1, 2});
  CHECK(i == 3);
  i = 0;
  CHECK(*option_value(args, i) == "3");
  CHECK(i == 1);
  i = 4;
  auto missing = option_value(args, i);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message == "--c: missing value");
  CHECK(i == 4);
  CHECK(int_option(args, i, 1, 5).error().message == "--c: missing value");
  CHECK(int_list_option(args, i, 1, 5).error().message == "--c: missing value");
  i = 0;
  CHECK(int_option(args, i, 4, 5).error().message == "--a: '3' is not an integer in [4, 5]");
}

TEST_CASE("the options every command takes") {
  const std::vector<std::string> args = {"--python", "/p", "--peer-script", "s.py",    "--no-peer",
                                         "--json",   "-h", "--other",       "--python"};
  CommonOptions o;
  CHECK(o.peer);
  CHECK_FALSE(o.json);
  CHECK_FALSE(o.help);
  CHECK(o.python == "/usr/bin/python3");
  CHECK(o.peer_script.empty());
  size_t i = 0;
  for (; i < 7; ++i) CHECK(*parse_common_option(args, i, o));
  CHECK(o.python == "/p");
  CHECK(o.peer_script == "s.py");
  CHECK_FALSE(o.peer);
  CHECK(o.json);
  CHECK(o.help);
  CHECK_FALSE(*parse_common_option(args, i, o));
  CHECK(i == 7);
  i = 8;
  CHECK(parse_common_option(args, i, o).error().message == "--python: missing value");
}

TEST_CASE("parse_options hands every other option to the command, and stops at an error") {
  const std::vector<std::string> args = {"--json", "--n", "4", "--no-peer", "--bad", "--json"};
  CommonOptions o;
  std::vector<std::string> seen;
  const actorpipe::Status s = parse_options(args, o, [&](size_t& i) -> actorpipe::Status {
    seen.push_back(args[i]);
    if (args[i] != "--n") return actorpipe::make_error("unknown option '{}'", args[i]);
    ++i;
    return {};
  });
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().message == "unknown option '--bad'");
  CHECK(seen == std::vector<std::string>{"--n", "--bad"});
  CHECK(o.json);
  CHECK_FALSE(o.peer);
}
