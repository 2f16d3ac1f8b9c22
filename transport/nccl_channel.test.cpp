// NCCL channel, the parts a machine without a GPU can check: the unique ids, the refusals of a
// link that cannot be made (a malformed id, memory that is not a GPU's), and what a build without
// NCCL says. Payloads over NCCL are tested end to end on a GPU machine (two processes on GPU
// stages against one: tests/multiprocess, scripts/gpu_run.sh).
#include "transport/nccl_channel.hpp"

#include <doctest/doctest.h>

#include <set>
#include <string>

#include "tests/support/text.hpp"

using namespace actorpipe;
using actorpipe::testing::contains;
using namespace std::chrono_literals;

TEST_CASE("unique ids are 256 hex characters, fresh each time (or the build says it has no NCCL)") {
  const std::string why = nccl_unavailable_reason();
  auto a = nccl_unique_id();
  if (!why.empty()) {
    REQUIRE_FALSE(a.ok());
    CHECK(contains(a.error().message, "this build has no NCCL"));
    return;
  }
  REQUIRE_MESSAGE(a.ok(), (a.ok() ? "" : a.error().message));
  auto b = nccl_unique_id();
  REQUIRE(b.ok());
  CHECK(a->size() == 256);
  CHECK(a->find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(*a != *b);
}

TEST_CASE("a link refuses a malformed id and memory that is not a GPU's, naming them") {
  const std::string why = nccl_unavailable_reason();
  auto short_id = NcclLink::connect("abc", true, host_backend_memory(), 1s);
  REQUIRE_FALSE(short_id.ok());
  auto host = NcclLink::connect(std::string(256, '0'), false, host_backend_memory(), 1s);
  REQUIRE_FALSE(host.ok());
  auto not_hex = NcclLink::connect(std::string(256, 'z'), false, host_backend_memory(), 1s);
  REQUIRE_FALSE(not_hex.ok());
  if (!why.empty()) {
    CHECK(contains(short_id.error().message, "this build has no NCCL"));
    return;
  }
  CHECK(contains(short_id.error().message, "an id of 3 characters, expected 256 (hex)"));
  CHECK(contains(not_hex.error().message, "the id is not hex at character 0"));
  CHECK(contains(host.error().message, "host memory is not a GPU's memory"));
}
