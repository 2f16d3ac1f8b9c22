// Helpers shared by the kernel tests: a seeded generator, conversions to double, bitwise
// comparison, closeness checks that report the worst element, and central differences.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace actorpipe::testing {

/// splitmix64: deterministic across platforms.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi).
  float uniform(float lo = -1.0f, float hi = 1.0f) {
    const double u = static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<float>(lo + (hi - lo) * u);
  }
  int32_t below(int32_t n) { return static_cast<int32_t>(next() % static_cast<uint64_t>(n)); }
};

inline std::vector<float> random_vec(size_t n, Rng& rng, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// Checks |got[i] - want[i]| <= atol + rtol·|want[i]| for all i; reports the worst element.
inline void check_close(const std::string& what, const std::vector<float>& got,
                        const std::vector<double>& want, double atol, double rtol) {
  REQUIRE_MESSAGE(got.size() == want.size(), what, ": size ", got.size(), " vs ", want.size());
  size_t worst = 0;
  double worst_excess = -1e300;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double lim = atol + rtol * std::fabs(want[i]);
    if (!(err <= lim)) ++bad;
    if (!(err - lim <= worst_excess)) {
      worst_excess = err - lim;
      worst = i;
    }
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", got.size(),
                " elements out of tolerance; worst [", worst, "] got ", got[worst], " want ",
                want[worst], " (atol ", atol, ", rtol ", rtol, ")");
}

/// Central differences of the scalar f at x (modified in place and restored), step h·max(1,|x|).
inline std::vector<double> numeric_grad(std::vector<double>& x, const std::function<double()>& f,
                                        double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    const double step = h * std::max(1.0, std::fabs(x0));
    x[i] = x0 + step;
    const double fp = f();
    x[i] = x0 - step;
    const double fm = f();
    x[i] = x0;
    g[i] = (fp - fm) / (2.0 * step);
  }
  return g;
}

/// Σ w[i]·y[i] in double: the scalar whose gradient with respect to y is w.
inline double project(const std::vector<double>& y, const std::vector<float>& w) {
  double s = 0.0;
  for (size_t i = 0; i < y.size(); ++i) s += y[i] * static_cast<double>(w[i]);
  return s;
}

}  // namespace actorpipe::testing
