// Wire: the text of an announcement and the check of one a peer sent, for every value its fields
// can hold (an announcement arrives as bytes from another process).
#include "transport/wire.hpp"

#include <doctest/doctest.h>

#include <limits>

namespace actorpipe {
namespace {

Announcement announcement() {
  Announcement a;
  a.tag = 2;
  a.sequence = 5;
  a.microbatch = 7;
  a.version = 1;
  a.dtype = DType::f32;
  a.ndim = 3;
  a.dims = {4, 16, 32, 0};
  return a;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("an announcement prints its shape, or its count of dims when that is out of range") {
  CHECK(to_string(announcement()) == "tag 2 #5 mb 7 v 1 f32[4, 16, 32]");
  Announcement a = announcement();
  a.ndim = 0;
  CHECK(to_string(a) == "tag 2 #5 mb 7 v 1 f32[]");
  // it used to read dims past the array (or build a vector of negative length)
  a.ndim = 7;
  CHECK(to_string(a) == "tag 2 #5 mb 7 v 1 f32 with 7 dims");
  a.ndim = -1;
  CHECK(to_string(a) == "tag 2 #5 mb 7 v 1 f32 with -1 dims");
  a.ndim = std::numeric_limits<int32_t>::min();
  a.dtype = static_cast<DType>(200);
  CHECK(to_string(a) == "tag 2 #5 mb 7 v 1 dtype(200) with -2147483648 dims");
}

TEST_CASE("payload_bytes: the product of the shape, or an error naming the announcement") {
  auto bytes = payload_bytes(announcement());
  REQUIRE(bytes.ok());
  CHECK(*bytes == 4 * 4 * 16 * 32);
  Announcement a = announcement();
  a.dtype = DType::i32;
  a.ndim = 0;
  CHECK(payload_bytes(a).value() == 4);
  a.ndim = 2;
  a.dims = {0, -1, 0, 0};  // a zero dim first: the negative one is still refused
  REQUIRE_FALSE(payload_bytes(a).ok());
  CHECK(payload_bytes(a).error().message ==
        "announcement tag 2 #5 mb 7 v 1 i32[0, -1] has dimension 1 = -1 (negative or above 1 TiB)");

  a = announcement();
  a.dtype = static_cast<DType>(9);
  CHECK(payload_bytes(a).error().message ==
        "announcement tag 2 #5 mb 7 v 1 dtype(9)[4, 16, 32] has unknown dtype 9");
  a = announcement();
  a.ndim = 5;
  CHECK(payload_bytes(a).error().message ==
        "announcement tag 2 #5 mb 7 v 1 f32 with 5 dims has 5 dims, expected 0 to 4");
  a = announcement();
  a.ndim = 4;
  a.dims = {1024, 1024, 1024, 1024};  // 4 TiB of floats
  CHECK(contains(payload_bytes(a).error().message, "has dimension 3 = 1024 (negative or above"));
  a.dims = {std::numeric_limits<int64_t>::max(), 2, 1, 1};
  CHECK(contains(payload_bytes(a).error().message, "has dimension 0 = 9223372036854775807"));
}

}  // namespace actorpipe
