// Bitwise equality of float and double sequences: the oracle of runs that must agree exactly.
#pragma once

#include <cstring>
#include <span>

namespace actorpipe::testing {

/// Same length and the same bits in every element (so -0 differs from 0, and equal NaNs agree).
/// Two empty sequences agree (memcmp is not called: an empty vector's data() may be null).
inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

inline bool same_bits(std::span<const double> a, std::span<const double> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

/// The same bits (so -0 differs from 0, and equal NaNs agree).
inline bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof(double)) == 0;
}

}  // namespace actorpipe::testing
