// Rng: SplitMix64 with Box-Muller normals, the documented generator behind parameter init.
// Simple enough to reproduce bit for bit in Python (see derive_seed and NormalRng below).
#pragma once

#include <cstdint>

namespace actorpipe {

/// SplitMix64 (Steele, Lea, Flood 2014):
///   state += 0x9E3779B97F4A7C15; z = state;
///   z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
///   return z ^ (z >> 31)
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  /// Uniform in the open interval (0, 1): ((next() >> 11) + 0.5) * 2^-53.
  double uniform();

 private:
  uint64_t state_;
};

/// Standard normals by Box-Muller on pairs of uniforms (u1, u2) from SplitMix64:
/// r = sqrt(-2 ln u1); yields r·cos(2π u2) first, then r·sin(2π u2); computed in double.
class NormalRng {
 public:
  explicit NormalRng(uint64_t seed) : base_(seed) {}
  double next();

 private:
  SplitMix64 base_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

/// The seed of an independent stream named by (seed, a, b), e.g. (init seed, layer, slot):
///   x = SplitMix64(seed).next() ^ a; y = SplitMix64(x).next() ^ b; return SplitMix64(y).next()
uint64_t derive_seed(uint64_t seed, uint64_t a, uint64_t b);

}  // namespace actorpipe
