// Rng: SplitMix64 with Box-Muller normals, the documented generator behind parameter init.
// Simple enough to reproduce bit for bit in Python (see derive_seed and NormalRng below).
#include "engine/rng.hpp"

#include <cmath>
#include <numbers>

namespace actorpipe {

uint64_t SplitMix64::next() {
  state_ += 0x9E3779B97F4A7C15ull;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double SplitMix64::uniform() {
  return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53;
}

double NormalRng::next() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double u1 = base_.uniform();
  const double u2 = base_.uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * std::numbers::pi * u2;
  spare_ = r * std::sin(theta);
  has_spare_ = true;
  return r * std::cos(theta);
}

uint64_t derive_seed(uint64_t seed, uint64_t a, uint64_t b) {
  const uint64_t x = SplitMix64(seed).next() ^ a;
  const uint64_t y = SplitMix64(x).next() ^ b;
  return SplitMix64(y).next();
}

}  // namespace actorpipe
