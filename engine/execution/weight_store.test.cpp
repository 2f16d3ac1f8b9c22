// Weight store tests: each policy's capacity, binding and release, where an update writes, and
// the refusals that keep a version from being written under a saved activation.
#include "engine/execution/weight_store.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "kernels/check.hpp"
#include "kernels/checked_backend.hpp"
#include "kernels/context.hpp"

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

TEST_CASE("bf16 stash: a stashed version keeps its product ranges as their bf16 rounding only") {
  // layer 0: 64 pages of floats, a product range over all but 16 floats at either end; layer 1
  // has none
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE)) / sizeof(float);
  const size_t n0 = 64 * page, r0 = 16, rn = n0 - 32;
  WeightStore s(VersionPolicy::double_buffered, 2, {n0, 8}, 2, {{0, r0, rn}});
  CHECK(s.bf16_stash());
  std::vector<float> w(n0);
  for (size_t i = 0; i < n0; ++i) w[i] = 1.0f + static_cast<float>(i) * 1e-5f;  // not bf16 values
  std::copy(w.begin(), w.end(), s.mutable_params(0, 0).begin());
  for (float& x : s.mutable_params(0, 1)) x = 3.0f;
  CHECK(s.stashed_bf16(0, 0, r0, rn) == nullptr);  // the newest version is f32

  s.bind(5, 0);  // a microbatch computes with version 0 while version 1 is made
  s.begin_update();
  const std::span<float> next = s.update_params(0);
  const std::span<const float> old = s.params(0, 0);
  CHECK(old.data() != next.data());  // version 0 moved; the update writes in place
  CHECK(s.bound_version(5) == 0);
  CHECK(s.versions() == std::vector<int>{0});
  const bf16* kept = s.stashed_bf16(0, 0, r0, rn);
  REQUIRE(kept != nullptr);
  CHECK(s.stashed_bf16(old.data() + r0 + 10, 4) == kept + 10);
  bool rounded = true;
  for (size_t i = 0; i < rn; ++i) rounded = rounded && kept[i] == to_bf16(w[r0 + i]);
  CHECK(rounded);
  CHECK(old[0] == w[0]);  // outside the range: f32
  CHECK(old[n0 - 1] == w[n0 - 1]);
  CHECK(old[r0 + rn / 2] == 0.0f);  // inside: its f32 pages were never written
  CHECK(s.params(0, 1)[0] == 3.0f);
  CHECK(s.stashed_bf16(old.data(), 2) == nullptr);                        // before the range: f32
  CHECK_THROWS_AS(s.stashed_bf16(old.data() + r0 - 1, 2), CheckFailure);  // straddles its start
  CHECK_THROWS_AS(s.stashed_bf16(old.data() + r0 + rn - 1, 2), CheckFailure);  // and its end
  for (float& x : next) x += 1.0f;
  s.commit_update();
  CHECK(s.latest() == 1);
  CHECK(s.params(1, 0)[r0] == w[r0] + 1.0f);
  CHECK(s.stashed_bf16(1, 0, r0, rn) == nullptr);
  CHECK_THROWS_AS(s.begin_update(), CheckFailure);  // version 0 is still bound
  s.release(5);

  // the bytes held: one f32 version, the stashed one's f32 ends and its bf16 values (and a few
  // pages: the partial ones at the ranges' ends, the zero page the read above mapped), not two
  // f32 versions
  const size_t f32_version = (n0 + 8) * sizeof(float);
  CHECK(s.resident_bytes() < f32_version + rn * sizeof(bf16) + 6 * page * sizeof(float));
  CHECK(s.resident_bytes() >= f32_version + rn * sizeof(bf16));

  // written (as a resume restores it), the stashed layer is f32 until settle() rounds it again
  std::span<float> back = s.mutable_params(0, 0);
  CHECK(back[r0] == round_bf16(w[r0]));  // widened from its bf16 values
  CHECK(s.stashed_bf16(0, 0, r0, rn) == nullptr);
  back[r0] = 2.5f;
  s.settle();
  REQUIRE(s.stashed_bf16(0, 0, r0, rn) != nullptr);
  CHECK(to_f32(*s.stashed_bf16(0, 0, r0, 1)) == 2.5f);
  CHECK(to_f32(s.stashed_bf16(0, 0, r0, rn)[1]) == round_bf16(w[r0 + 1]));
  CHECK(s.resident_bytes() < f32_version + rn * sizeof(bf16) + 6 * page * sizeof(float));

  // the next update stashes version 1 over version 0
  bump(s);
  CHECK(s.versions() == std::vector<int>{1, 2});
  CHECK(to_f32(*s.stashed_bf16(1, 0, r0, 1)) == round_bf16(w[r0] + 1.0f));
  CHECK(s.params(2, 0)[r0] == w[r0] + 2.0f);
  s.reset(9);
  CHECK(s.versions() == std::vector<int>{9});
  CHECK(s.params(9, 0)[r0] == w[r0] + 2.0f);

  // one buffer keeps nothing stashed; ranges out of order or outside their layer are refused
  CHECK_FALSE(WeightStore(VersionPolicy::ring, 1, {8}, 1, {{0, 0, 4}}).bf16_stash());
  CHECK_THROWS_AS(WeightStore(VersionPolicy::ring, 2, {8}, 1, {{0, 4, 4}, {0, 0, 2}}),
                  CheckFailure);
  CHECK_THROWS_AS(WeightStore(VersionPolicy::ring, 2, {8}, 1, {{0, 6, 4}}), CheckFailure);
}

TEST_CASE("bf16 stash in a ring: each stashed version keeps its own bf16 values") {
  WeightStore s(VersionPolicy::ring, 3, {6}, 3, {{0, 1, 4}});
  const float third = 1.0f / 3.0f, v1 = third + 1.0f, v2 = v1 + 1.0f;
  for (float& x : s.mutable_params(0, 0)) x = third;
  s.bind(0, 0);
  bump(s);
  s.bind(1, 1);
  bump(s);
  CHECK(s.versions() == std::vector<int>{0, 1, 2});
  CHECK(to_f32(*s.stashed_bf16(0, 0, 1, 1)) == round_bf16(third));
  CHECK(to_f32(*s.stashed_bf16(1, 0, 1, 1)) == round_bf16(v1));
  CHECK(s.params(0, 0)[0] == third);
  CHECK(s.params(2, 0)[1] == v2);
  CHECK_THROWS_AS(s.begin_update(), CheckFailure);  // both stashed versions are bound
  s.release(0);
  bump(s);  // over version 0, the oldest unpinned one
  CHECK(s.versions() == std::vector<int>{1, 2, 3});
  CHECK(to_f32(*s.stashed_bf16(2, 0, 1, 1)) == round_bf16(v2));
}

TEST_CASE("generation: an update changes the buffer it writes, a write changes its layer only") {
  WeightStore s(VersionPolicy::double_buffered, 2, {2, 3}, 4);
  auto gens = [&s] {
    std::vector<uint64_t> g;
    for (int b = 0; b < s.capacity(); ++b)
      for (int l = 0; l < s.num_layers(); ++l) g.push_back(s.generation(b, l));
    return g;
  };
  const std::vector<uint64_t> g0 = gens();
  bump(s);  // version 1 into buffer 1: buffer 0 (version 0) untouched
  std::vector<uint64_t> g1 = gens();
  CHECK(g1[0] == g0[0]);
  CHECK(g1[1] == g0[1]);
  CHECK(g1[2] > g0[2]);
  CHECK(g1[3] > g0[3]);
  CHECK(s.buffer(1, 1).data() == s.params(1, 1).data());
  // a write into layer 1 of version 0 changes that layer of that buffer only
  s.mutable_params(0, 1)[0] = 5.0f;
  std::vector<uint64_t> g2 = gens();
  CHECK(g2[0] == g1[0]);
  CHECK(g2[1] > g1[1]);
  CHECK(g2[2] == g1[2]);
  CHECK(g2[3] == g1[3]);
  // commit renames without writing the buffer that stays
  s.begin_update();  // version 2 over version 0's buffer
  s.update_params(0);
  s.commit_update();
  std::vector<uint64_t> g3 = gens();
  CHECK(g3[0] > g2[0]);
  CHECK(g3[1] > g2[1]);
  CHECK(g3[2] == g2[2]);
  CHECK(g3[3] == g2[3]);
  // a reset renames: nothing is written
  s.reset(7);
  CHECK(gens() == g3);
  CHECK(s.params(7, 1).data() == s.buffer(0, 1).data());
}

TEST_CASE("in memory of a backend: versions live there and an update copies through it") {
  Context ctx(1);
  CheckedBackend dev(ctx);  // the host touching its memory outside its operations faults
  const size_t regions = dev.regions();
  {
    WeightStore s(VersionPolicy::ring, 3, {3, 2}, 4, {}, dev);
    CHECK(dev.regions() == regions + 3);  // a buffer per version, allocated up front
    CHECK(s.resident_bytes() == 3 * 5 * sizeof(float));
    auto load = [&](std::span<float> dst, float x) {
      const std::vector<float> v(dst.size(), x);
      dev.to_backend(dst.data(), v.data(), v.size());
    };
    auto read = [&](std::span<const float> src) {
      std::vector<float> v(src.size());
      dev.to_host(v.data(), src.data(), v.size());
      return v;
    };
    load(s.mutable_params(0, 0), 1.0f);
    load(s.mutable_params(0, 1), 2.0f);
    s.bind(0, 0);
    s.begin_update();  // the newest version copied into a free buffer, through the backend
    for (int l = 0; l < 2; ++l) CHECK(dev.owns(s.update_params(l).data()));
    CHECK(read(s.update_params(1)) == std::vector<float>{2.0f, 2.0f});
    load(s.update_params(0), 3.0f);
    s.commit_update();
    CHECK(read(s.params(0, 0)) == std::vector<float>(3, 1.0f));  // bound: kept
    CHECK(read(s.params(1, 0)) == std::vector<float>(3, 3.0f));
    CHECK(read(s.params(1, 1)) == std::vector<float>(2, 2.0f));
    for (std::span<const float> b : s.buffers()) CHECK(dev.owns(b.data()));
  }
  CHECK(dev.regions() == regions);  // released with the store
  CHECK_THROWS_WITH_AS(WeightStore(VersionPolicy::ring, 2, {4}, 2, {{0, 0, 4}}, dev),
                       doctest::Contains("bf16 weight stash rounds its versions on the host"),
                       CheckFailure);
}
