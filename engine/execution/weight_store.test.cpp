// Weight store tests: each policy's capacity, binding and release, where an update writes, and
// the refusals that keep a version from being written under a saved activation.
#include "engine/execution/weight_store.hpp"

#include <doctest/doctest.h>

#include <vector>

#include "kernels/check.hpp"

using namespace actorpipe;

namespace {

// Produces the next version: every float of the copied newest version plus 1.
void bump(WeightStore& s) {
  s.begin_update();
  for (int l = 0; l < s.num_layers(); ++l)
    for (float& x : s.update_params(l)) x += 1.0f;
  s.commit_update();
}

float value(const WeightStore& s, int version) {
  return s.params(version, 0)[0];
}

}  // namespace

TEST_CASE("policies and capacities per mode") {
  CHECK(version_policy(Mode::gpipe) == VersionPolicy::single);
  CHECK(version_policy(Mode::onef1b) == VersionPolicy::single);
  CHECK(version_policy(Mode::twobw) == VersionPolicy::double_buffered);
  CHECK(version_policy(Mode::pipedream) == VersionPolicy::ring);
  CHECK(version_policy(Mode::xpipe) == VersionPolicy::predicted);
  for (int d = 1; d <= 8; ++d) {
    for (int r = 0; r < d; ++r) {
      CHECK(version_capacity(Mode::gpipe, d, r) == 1);
      CHECK(version_capacity(Mode::twobw, d, r) == 2);
      CHECK(version_capacity(Mode::pipedream, d, r) == d - r);
      CHECK(version_capacity(Mode::xpipe, d, r) == 1);
    }
  }
  CHECK(to_string(VersionPolicy::ring) == "ring");
}

TEST_CASE("single: updates in place, refuses an update with a microbatch bound") {
  WeightStore s(VersionPolicy::single, 1, {3, 2}, 4);
  CHECK(s.latest() == 0);
  CHECK(s.params(0, 1).size() == 2);
  s.mutable_params(0, 0)[0] = 5.0f;
  s.bind(7, 0);
  CHECK(s.bound_version(7) == 0);
  CHECK_THROWS_AS(s.begin_update(), CheckFailure);
  CHECK_THROWS_AS(s.mutable_params(0, 0), CheckFailure);  // under a saved activation
  s.release(7);
  bump(s);
  CHECK(s.latest() == 1);
  CHECK_FALSE(s.holds(0));
  CHECK(value(s, 1) == 6.0f);
  CHECK(s.peak_versions() == 1);
  CHECK_THROWS_AS(s.bind(1, 0), CheckFailure);  // version 0 is gone
}

TEST_CASE("ring: an update writes over the oldest unpinned version, never a bound one") {
  // stage 0 of pipedream with d = 3: three buffers
  WeightStore s(VersionPolicy::ring, 3, {4}, 3);
  s.bind(0, 0);
  s.bind(1, 0);
  bump(s);  // version 1 into an empty buffer
  s.bind(2, 1);
  bump(s);  // version 2: 0 and 1 are pinned, the third buffer is empty
  CHECK(s.versions() == std::vector<int>{0, 1, 2});
  CHECK(s.peak_versions() == 3);
  CHECK(value(s, 0) == 0.0f);
  CHECK(value(s, 1) == 1.0f);
  CHECK(value(s, 2) == 2.0f);
  CHECK_THROWS_AS(s.begin_update(), CheckFailure);  // every buffer pinned
  s.release(0);
  CHECK_THROWS_AS(s.begin_update(), CheckFailure);  // microbatch 1 still pins version 0
  s.release(1);
  bump(s);  // overwrites version 0
  CHECK(s.versions() == std::vector<int>{1, 2, 3});
  CHECK(value(s, 3) == 3.0f);
  CHECK(s.bound_version(2) == 1);
  CHECK(value(s, 1) == 1.0f);                   // the bound version is untouched
  CHECK_THROWS_AS(s.bind(2, 3), CheckFailure);  // bound twice
  CHECK_THROWS_AS(s.release(9), CheckFailure);
  // the stash bound
  s.bind(3, 3);
  s.bind(4, 3);
  CHECK_THROWS_AS(s.bind(5, 3), CheckFailure);
}

TEST_CASE("double buffered: the newest and the previous version") {
  WeightStore s(VersionPolicy::double_buffered, 2, {2}, 4);
  bump(s);  // 1
  CHECK(s.versions() == std::vector<int>{0, 1});
  bump(s);  // 2 over 0 (unpinned, older)
  CHECK(s.versions() == std::vector<int>{1, 2});
  s.bind(0, 1);  // a microbatch of the current step computes with the previous version
  CHECK_THROWS_AS(s.begin_update(), CheckFailure);  // both buffers pinned
  s.release(0);
  bump(s);  // 3 over 1
  CHECK(s.versions() == std::vector<int>{2, 3});
  CHECK(value(s, 2) == 2.0f);
  CHECK(s.peak_versions() == 2);
}

TEST_CASE("predicted: one version updated in place while microbatches are in flight") {
  WeightStore s(VersionPolicy::predicted, 1, {2}, 2);
  CHECK_THROWS_AS(s.bind(0, 0), CheckFailure);
  bump(s);
  bump(s);
  CHECK(s.latest() == 2);
  CHECK(s.versions() == std::vector<int>{2});
  CHECK(value(s, 2) == 2.0f);
}

TEST_CASE("reset renames the newest version and forgets the others") {
  WeightStore s(VersionPolicy::ring, 2, {1}, 2);
  bump(s);
  CHECK(s.versions() == std::vector<int>{0, 1});
  s.reset(10);
  CHECK(s.versions() == std::vector<int>{10});
  CHECK(value(s, 10) == 1.0f);
  bump(s);
  CHECK(s.latest() == 11);
  CHECK_THROWS_AS(WeightStore(VersionPolicy::single, 2, {1}, 1), CheckFailure);
  CHECK_THROWS_AS(WeightStore(VersionPolicy::double_buffered, 3, {1}, 1), CheckFailure);
}

TEST_CASE("add_older restores the version before the newest into the free buffer") {
  WeightStore s(VersionPolicy::double_buffered, 2, {2}, 2);
  bump(s);
  s.reset(7);  // a resume at update 7: the newest version only
  CHECK(s.versions() == std::vector<int>{7});
  s.add_older(6);
  CHECK(s.versions() == std::vector<int>{6, 7});
  CHECK(s.latest() == 7);
  for (float& x : s.mutable_params(6, 0)) x = 5.0f;
  CHECK(value(s, 6) == 5.0f);
  CHECK(value(s, 7) == 1.0f);
  s.bind(0, 6);                                     // a continued run's first step computes with it
  CHECK_THROWS_AS(s.begin_update(), CheckFailure);  // both buffers pinned
  s.release(0);
  bump(s);  // writes over version 6, the oldest unpinned one
  CHECK(s.versions() == std::vector<int>{7, 8});
  CHECK(value(s, 8) == 2.0f);
  CHECK_THROWS_AS(s.add_older(7), CheckFailure);  // already stored
  CHECK_THROWS_AS(s.add_older(6), CheckFailure);  // no free buffer
  CHECK_THROWS_AS(s.add_older(9), CheckFailure);  // not older than the newest
}
