// Branch-free float math that gcc vectorises: exp, tanh and fixed-lane sums. The same
// arithmetic runs in vector and scalar code (kernels build with -ffp-contract=off and use
// std::fma explicitly), so results never depend on where a loop is split.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace actorpipe::internal {

/// Lanes of the fixed-order reductions: a sum over n elements accumulates element i into
/// lane i % kLanes, then adds the lanes in order 0..kLanes-1.
inline constexpr int kLanes = 16;

/// Elements per chunk boundary of a split elementwise loop (Context::parallel_for_aligned): one
/// cache line of floats, so no two threads write the same line.
inline constexpr int64_t kAlignElems = 16;

/// exp(x) with a relative error of about 2 ulp; 0 below -87.3, exp(88.37) above 88.37.
inline float exp_f32(float x) {
  const float xc = x < -87.3f ? -87.3f : (x > 88.37f ? 88.37f : x);
  // n = round(x / ln2) via the 1.5 * 2^23 shifter (round to nearest even).
  const float shifter = 12582912.0f;
  const float t = std::fma(xc, 1.44269504088896341f, shifter);
  const float n = t - shifter;
  float r = std::fma(n, -0.693359375f, xc);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r + 1.0f);
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  const float y = p * std::bit_cast<float>(e);
  return x < -87.3f ? 0.0f : y;
}

/// tanh(x) = 1 - 2 / (exp(2x) + 1); absolute error about 1e-7.
inline float tanh_f32(float x) {
  return 1.0f - 2.0f / (exp_f32(2.0f * x) + 1.0f);
}

/// Σ x[i] in the fixed lane order.
inline float lane_sum(const float* __restrict x, long n) {
  float acc[kLanes] = {};
  long i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j];
  for (int j = 0; i + j < n; ++j) acc[j] += x[i + j];
  float s = 0.0f;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

/// Σ x[i]·y[i] in the fixed lane order.
inline float lane_dot(const float* __restrict x, const float* __restrict y, long n) {
  float acc[kLanes] = {};
  long i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = std::fma(x[i + j], y[i + j], acc[j]);
  for (int j = 0; i + j < n; ++j) acc[j] = std::fma(x[i + j], y[i + j], acc[j]);
  float s = 0.0f;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

/// max x[i] (n >= 1).
inline float lane_max(const float* __restrict x, long n) {
  float acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = x[0];
  long i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
  for (int j = 0; i + j < n; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
  float m = acc[0];
  for (int j = 1; j < kLanes; ++j) m = acc[j] > m ? acc[j] : m;
  return m;
}

}  // namespace actorpipe::internal
