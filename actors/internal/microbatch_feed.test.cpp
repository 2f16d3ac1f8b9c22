// Microbatch feed: every stage of a process gets microbatch n, read once from the loader in
// order; shapes and loader failures are errors, not crashes.
#include "actors/internal/microbatch_feed.hpp"

#include <doctest/doctest.h>

#include "engine/data/loader.hpp"
#include "tests/support/tiny_model.hpp"

namespace actorpipe::internal {

TEST_CASE("microbatch feed: shared by the consumers, read in order, dropped when all took it") {
  DataOptions d;
  auto loader = DataLoader::open(d, Arch::gpt, 24, 2, 6);
  REQUIRE(loader.ok());
  auto fresh = DataLoader::open(d, Arch::gpt, 24, 2, 6);
  REQUIRE(fresh.ok());
  MicrobatchFeed feed(**loader, 2, 6, /*consumers=*/2);
  auto a2 = feed.take(2);  // reads 0, 1, 2
  REQUIRE(a2.ok());
  CHECK(feed.read() == 3);
  auto a0 = feed.take(0);
  auto b0 = feed.take(0);
  REQUIRE((a0.ok() && b0.ok()));
  CHECK(a0->get() == b0->get());  // one copy for both stages
  const Microbatch expect0 = (*fresh)->next();
  CHECK((*a0)->tokens == expect0.tokens);
  CHECK((*a0)->targets == expect0.targets);
  CHECK_FALSE(feed.take(0).ok());  // both consumers took it
  CHECK_FALSE(feed.take(-1).ok());
}

TEST_CASE("microbatch feed: a microbatch of another shape is an error naming both") {
  DataOptions d;
  auto loader = DataLoader::open(d, Arch::gpt, 24, 2, 6);
  REQUIRE(loader.ok());
  MicrobatchFeed feed(**loader, 3, 6, 1);
  auto r = feed.take(0);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message == "the data loader gave a (2, 6) microbatch, expected (3, 6)");
}

}  // namespace actorpipe::internal
