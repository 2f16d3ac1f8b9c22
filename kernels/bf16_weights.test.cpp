// Bf16Weights tests: a copy is made once per change of its covered range, the other ranges'
// copies stay, an update's own rounding is taken once marked, and misuse is refused.
#include "kernels/bf16_weights.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/check.hpp"
#include "kernels/context.hpp"

using namespace actorpipe;

namespace {

// the bf16 rounding of w's floats, as copy() must give them
std::vector<bf16> rounded(const std::vector<float>& w) {
  std::vector<bf16> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) out[i] = to_bf16(w[i]);
  return out;
}

bool same(const bf16* a, const std::vector<bf16>& b) {
  for (size_t i = 0; i < b.size(); ++i)
    if (a[i].bits != b[i].bits) return false;
  return true;
}

}  // namespace

TEST_CASE("a range's copies are made once per change of that range, the others' stay") {
  Context ctx(1);
  std::vector<float> a(64), b(64);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = 0.1f * static_cast<float>(i) + 1e-3f;
    b[i] = -0.2f * static_cast<float>(i) - 1e-3f;
  }
  Bf16Weights w;
  w.cover(a);
  w.cover(b);
  w.sync(a.data(), 7);
  w.sync(b.data(), 3);
  const bf16* ca = w.copy(ctx, a.data(), 32);
  const bf16* cb = w.copy(ctx, b.data() + 32, 32);
  CHECK(w.copies_made() == 2);
  CHECK(same(ca, rounded({a.begin(), a.begin() + 32})));
  CHECK(same(cb, rounded({b.begin() + 32, b.end()})));
  // the same counters: nothing is made again
  w.sync(a.data(), 7);
  w.sync(b.data(), 3);
  CHECK(w.copy(ctx, a.data(), 32) == ca);
  CHECK(w.copy(ctx, b.data() + 32, 32) == cb);
  CHECK(w.copies_made() == 2);
  // a changes: only its copy is made again, from its new values
  for (float& x : a) x *= 3.0f;
  w.sync(a.data(), 8);
  w.sync(b.data(), 3);
  CHECK(w.copy(ctx, b.data() + 32, 32) == cb);
  CHECK(w.copies_made() == 2);
  CHECK(same(w.copy(ctx, a.data(), 32), rounded({a.begin(), a.begin() + 32})));
  CHECK(w.copies_made() == 3);
  // one counter for every range forgets them all
  w.sync(1);
  w.copy(ctx, a.data(), 32);
  w.copy(ctx, b.data() + 32, 32);
  CHECK(w.copies_made() == 5);
  CHECK(w.bytes() == 64 * sizeof(bf16));
}

TEST_CASE("an update's rounding is taken once marked, until its range changes again") {
  Context ctx(1);
  std::vector<float> a(16, 1.5f), b(16, 2.5f);
  Bf16Weights w;
  w.cover(a);
  w.cover(b);
  w.sync(1);
  w.copy(ctx, b.data(), 16);
  bf16* r = w.reserve(a.data(), 16);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = 0.75f;  // the update writes the new values and their rounding in one pass
    r[i] = to_bf16(a[i]);
  }
  w.sync(a.data(), 2);  // the owner counted the write
  w.mark_current(a.data());
  CHECK(w.copy(ctx, a.data(), 16) == r);
  CHECK(w.copies_made() == 1);  // b's only
  CHECK(w.copies_marked() == 1);
  w.sync(a.data(), 3);
  w.copy(ctx, a.data(), 16);
  CHECK(w.copies_made() == 2);
  // an operand outside every range is converted into the arena each time, never kept
  std::vector<float> other(16, 4.0f);
  const bf16* o = w.copy(ctx, other.data(), 16);
  CHECK(same(o, rounded(other)));
  CHECK(w.copies_made() == 2);
}

TEST_CASE("the copies start on cache lines, as the products read them") {
  Context ctx(1);
  std::vector<float> a(1000, 0.5f);
  Bf16Weights w;
  w.cover(a);
  w.sync(1);
  // an operand that starts anywhere in the range: its own copy, on a line of its own
  for (int at : {0, 1, 7, 100})
    CHECK(reinterpret_cast<uintptr_t>(w.copy(ctx, a.data() + at, 300)) % 64 == 0);
  CHECK(reinterpret_cast<uintptr_t>(w.reserve(a.data() + 3, 200)) % 64 == 0);
}

TEST_CASE("overlapping ranges, an unknown range, an array never reserved are refused") {
  std::vector<float> a(32);
  Bf16Weights w;
  w.cover(a.data(), 16);
  CHECK_THROWS_WITH_AS(w.cover(a.data() + 8, 16), doctest::Contains("overlaps"), CheckFailure);
  w.cover(a.data() + 16, 16);  // adjacent: fine
  CHECK_THROWS_WITH_AS(w.sync(a.data() + 4, 1), doctest::Contains("no covered range starts"),
                       CheckFailure);
  CHECK_THROWS_WITH_AS(w.mark_current(a.data()), doctest::Contains("no array reserved"),
                       CheckFailure);
  CHECK_THROWS_WITH_AS(w.reserve(a.data() + 8, 16), doctest::Contains("not in a covered range"),
                       CheckFailure);
}
