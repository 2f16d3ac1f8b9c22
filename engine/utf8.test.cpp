// UTF-8 validation against hand-made sequences of every kind RFC 3629 forbids.
#include "engine/utf8.hpp"

#include <doctest/doctest.h>

#include <string>

using namespace actorpipe;

TEST_CASE("UTF-8 validation") {
  auto check = [](std::string s) {
    return find_invalid_utf8({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
  };
  CHECK_FALSE(check("plain ascii").has_value());
  CHECK_FALSE(check("\xC2\xA9 \xE2\x82\xAC \xF0\x9F\x8E\x89 \xF4\x8F\xBF\xBF").has_value());
  CHECK(check("ab\x80") == 2u);            // stray continuation byte
  CHECK(check("a\xC0\x80") == 1u);         // overlong NUL
  CHECK(check("\xE0\x80\x80") == 0u);      // overlong 3-byte form
  CHECK(check("xy\xED\xA0\x80") == 2u);    // UTF-16 surrogate
  CHECK(check("\xF4\x90\x80\x80") == 0u);  // above U+10FFFF
  CHECK(check("ok\xE2\x82") == 2u);        // cut sequence at the end
  CHECK(check("\xE2\x28\xA1") == 0u);      // bad continuation
  CHECK(check("\xF5\x80\x80\x80") == 0u);  // invalid lead
}
