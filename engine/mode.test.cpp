// Tests of Mode: names round-trip and unknown names are rejected with the allowed list.
// The five names are the ones the config file and the command line accept.
#include "engine/mode.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace actorpipe;

TEST_CASE("mode names round-trip") {
  const char* names[] = {"gpipe", "1f1b", "2bw", "pipedream", "xpipe"};
  int i = 0;
  for (Mode m : all_modes) {
    CHECK(to_string(m) == names[i]);
    Mode parsed = Mode::xpipe;
    REQUIRE(from_string(names[i], parsed));
    CHECK(parsed == m);
    auto e = parse_mode(names[i]);
    REQUIRE(e.ok());
    CHECK(*e == m);
    ++i;
  }
  CHECK(is_synchronous(Mode::gpipe));
  CHECK(is_synchronous(Mode::onef1b));
  CHECK_FALSE(is_synchronous(Mode::twobw));
  CHECK_FALSE(is_synchronous(Mode::pipedream));
  CHECK_FALSE(is_synchronous(Mode::xpipe));
}

TEST_CASE("unknown mode names are rejected") {
  Mode m = Mode::twobw;
  CHECK_FALSE(from_string("1F1B", m));
  CHECK_FALSE(from_string("", m));
  CHECK(m == Mode::twobw);
  auto e = parse_mode("onef1b");
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().message.find("'onef1b'") != std::string::npos);
  CHECK(e.error().message.find("gpipe, 1f1b, 2bw, pipedream, xpipe") != std::string::npos);
}
