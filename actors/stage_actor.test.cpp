// Stage actor message tests: the announcement a stage sends survives CAF's binary serialisation
// bit for bit (it is the one message meant to cross processes) and prints as its text form.
#include "actors/stage_actor.hpp"

#include <doctest/doctest.h>

#include <vector>

#include "actors/internal/messages.hpp"

using namespace actorpipe;

TEST_CASE("an announcement round-trips through CAF's binary serialiser") {
  Announcement a;
  a.tag = channel_tag(2, Direction::backward);
  a.sequence = 123456789012ull;
  a.microbatch = 77;
  a.version = 3;
  a.dtype = DType::f32;
  a.ndim = 3;
  a.dims = {4, 128, 768, 0};
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  REQUIRE(!sink(a));
  CHECK(!buf.empty());
  Announcement b;
  caf::binary_deserializer source{nullptr, buf};
  REQUIRE(!source(b));
  CHECK(b == a);
  const std::string text = caf::deep_to_string(a);
  CHECK(text == "tag 5 #123456789012 mb 77 v 3 f32[4, 128, 768]");
  // a message holding it keeps the value (local sends share, never copy the payload)
  auto msg = caf::make_message(internal::ann_atom::value, a);
  CHECK(msg.get_as<Announcement>(1) == a);
}
