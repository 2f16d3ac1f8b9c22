// AlignedVector tests: every allocation starts on a cache line, whatever the element type and
// size, through growth and copies.
#include "kernels/aligned_vector.hpp"

#include <doctest/doctest.h>

#include <cstdint>

#include "kernels/bf16.hpp"

using namespace actorpipe;

namespace {
bool on_line(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kCacheLine == 0;
}
}  // namespace

TEST_CASE("AlignedVector's elements start on a cache line") {
  for (size_t n : {size_t{1}, size_t{3}, size_t{17}, size_t{1000}, size_t{1} << 20}) {
    CAPTURE(n);
    AlignedVector<float> f(n, 1.0f);
    AlignedVector<bf16> h(n);
    AlignedVector<char> c(n);
    CHECK(on_line(f.data()));
    CHECK(on_line(h.data()));
    CHECK(on_line(c.data()));
    f.resize(3 * n + 1);  // a reallocation
    CHECK(on_line(f.data()));
    CHECK(f[0] == 1.0f);
    const AlignedVector<float> copy = f;
    CHECK(on_line(copy.data()));
    CHECK(copy == f);
  }
}
