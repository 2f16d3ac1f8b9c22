// Vector math tests: exp and tanh accuracy over their whole range, the fixed-lane sums.
#include "kernels/internal/vecmath.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

using namespace actorpipe::internal;

TEST_CASE("exp_f32 is within 3 ulp of exp from -87 to 88.37, 0 below and finite above") {
  double worst = 0.0;
  for (double x = -87.0; x <= 88.37; x += 0.00173) {
    const float xf = static_cast<float>(x);
    const double want = std::exp(static_cast<double>(xf));
    const double got = exp_f32(xf);
    worst = std::max(worst, std::fabs(got - want) / want);
  }
  CHECK(worst < 3 * 1.2e-7);
  CHECK(exp_f32(0.0f) == 1.0f);
  CHECK(exp_f32(-100.0f) == 0.0f);
  CHECK(exp_f32(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(std::isfinite(exp_f32(1000.0f)));
}

TEST_CASE("tanh_f32 has an absolute error below 2e-7 and saturates") {
  double worst = 0.0;
  for (double x = -20.0; x <= 20.0; x += 0.0007) {
    const float xf = static_cast<float>(x);
    worst = std::max(worst, std::fabs(tanh_f32(xf) - std::tanh(static_cast<double>(xf))));
  }
  CHECK(worst < 2e-7);
  CHECK(tanh_f32(50.0f) == 1.0f);
  CHECK(tanh_f32(-50.0f) == -1.0f);
}

TEST_CASE("lane sums follow the documented order") {
  float x[37];
  for (int i = 0; i < 37; ++i) x[i] = 1.0f / static_cast<float>(i + 1) * (i % 3 == 0 ? 1e4f : 1.0f);
  float acc[kLanes] = {};
  for (int i = 0; i < 37; ++i) acc[i % kLanes] += x[i];
  float want = 0.0f;
  for (float a : acc) want += a;
  CHECK(lane_sum(x, 37) == want);
  float dacc[kLanes] = {};
  for (int i = 0; i < 37; ++i) dacc[i % kLanes] = std::fma(x[i], x[36 - i], dacc[i % kLanes]);
  float dwant = 0.0f;
  for (float a : dacc) dwant += a;
  CHECK(lane_dot(x, x + 0, 37) == lane_dot(x, x, 37));
  float y[37];
  for (int i = 0; i < 37; ++i) y[i] = x[36 - i];
  CHECK(lane_dot(x, y, 37) == dwant);
  CHECK(lane_max(x, 37) == 1e4f);
  CHECK(lane_max(x + 1, 2) == 0.5f);
}
