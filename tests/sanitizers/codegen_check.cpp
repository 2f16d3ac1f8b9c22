// tests.sanitizers.codegen (ThreadSanitizer build only): GCC 12.2 at -O1 with -fsanitize=thread
// compiled this comparison wrongly (both orders came out "not before"), which made the
// planner's brute-force test pick another of two equal plans under TSan only. The build adds
// -fno-tree-forwprop to every TSan target (cmake/ActorpipeHelpers.cmake); without it this test
// fails. The values are the two plans the planner test met.
#include <array>
#include <cstdint>
#include <cstdio>

// External linkage on purpose: in an anonymous namespace the bug does not show.
namespace codegen_check {

struct Plan {
  int d = 0;
  std::array<int, 4> counts{};
  std::uint32_t mask = 0;
  std::array<double, 4> seconds{};
  std::array<std::int64_t, 4> bytes{};  // not compared, but without it the bug hides
  std::array<std::int64_t, 4> activations{};
  double bottleneck = 0.0;
  int recomputed = 0;
};

[[gnu::noinline]] bool before(const Plan& a, const Plan& b) {
  if (a.bottleneck != b.bottleneck) return a.bottleneck < b.bottleneck;
  if (a.recomputed != b.recomputed) return a.recomputed < b.recomputed;
  for (int r = a.d - 1; r >= 0; --r) {
    if (a.counts[r] != b.counts[r]) return a.counts[r] < b.counts[r];
  }
  int first = 0;
  for (int r = 0; r < a.d; ++r) {
    if (a.seconds[r] != b.seconds[r]) return a.seconds[r] < b.seconds[r];
    if (a.activations[r] != b.activations[r]) return a.activations[r] < b.activations[r];
    for (int l = first; l < first + a.counts[r]; ++l) {
      const bool x = (a.mask >> l) & 1U, y = (b.mask >> l) & 1U;
      if (x != y) return !x;
    }
    first += a.counts[r];
  }
  return false;
}

}  // namespace codegen_check

using codegen_check::before;
using codegen_check::Plan;

int main() {
  Plan a, b;
  a.d = b.d = 3;
  a.counts = b.counts = {2, 1, 2, 0};
  a.seconds = b.seconds = {78.25, 23, 42.75, 0};
  a.bottleneck = b.bottleneck = 78.25;
  a.recomputed = b.recomputed = 3;
  a.mask = 19;
  b.mask = 11;
  a.activations = {30, 66, 33, 0};  // fewer activation bytes on the last stage: a comes first
  b.activations = {30, 66, 84, 0};
  const bool ab = before(a, b), ba = before(b, a);
  std::printf("before(a, b) = %d (want 1), before(b, a) = %d (want 0)\n", ab, ba);
  return ab && !ba ? 0 : 1;
}
