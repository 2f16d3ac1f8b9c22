// DataRng: the pseudo-random generator of the data sources (xoshiro256**), seeded from a
// counter key (seed, stream, a, b) so that any sequence of any microbatch is reachable in O(1).
#pragma once

#include <cstdint>

namespace actorpipe {

/// SplitMix64 finaliser: a bijective 64-bit mix (Steele, Lea, Flood 2014).
constexpr uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// Deterministic generator with platform-independent output (no <random> distributions, whose
/// results differ between standard libraries).
class DataRng {
 public:
  /// Seeds the four state words from `seed` by SplitMix64, as the xoshiro authors recommend.
  explicit DataRng(uint64_t seed) {
    uint64_t z = seed;
    for (uint64_t& w : s_) {
      z += 0x9e3779b97f4a7c15ULL;
      w = splitmix64_mix(z);
    }
  }

  /// A generator for key (seed, stream, a, b): e.g. stream = purpose, a = position, b = row.
  static DataRng derive(uint64_t seed, uint64_t stream, uint64_t a, uint64_t b) {
    uint64_t h = splitmix64_mix(seed ^ 0x6a09e667f3bcc909ULL);
    h = splitmix64_mix(h ^ splitmix64_mix(stream + 0xbb67ae8584caa73bULL));
    h = splitmix64_mix(h ^ splitmix64_mix(a + 0x3c6ef372fe94f82bULL));
    h = splitmix64_mix(h ^ splitmix64_mix(b + 0xa54ff53a5f1d36f1ULL));
    return DataRng(h);
  }

  /// Next 64 random bits.
  uint64_t next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  /// Uniform double in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  /// Uniform integer in [0, n), n ≥ 1, without modulo bias (rejection of the short tail).
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    for (;;) {
      const uint64_t r = next_u64();
      if (r >= threshold) return r % n;
    }
  }

 private:
  static constexpr uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace actorpipe
