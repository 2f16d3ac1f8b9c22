// Basis rotation: the eigenvectors diagonalise their matrix; each update of the rotated AdamW
// against a double reference computed from the float state before it (with the kernel's own
// eigenvectors where it refreshed them, checked to diagonalise its covariance); one side or
// both; the look-ahead; the same bits for any thread count.
#include "kernels/basis_rotation.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kernels/check.hpp"
#include "kernels/internal/test_util.hpp"

using namespace actorpipe;
using namespace actorpipe::testing;

namespace {

using Mat = std::vector<double>;  // row-major

// a (n × k) · b (k × m), with either transposed as stored (a: k × n, b: m × k)
Mat mul(const Mat& a, const Mat& b, int n, int k, int m, bool ta = false, bool tb = false) {
  Mat c(static_cast<size_t>(n) * m, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < m; ++j) {
      double s = 0.0;
      for (int l = 0; l < k; ++l) {
        const double x = ta ? a[static_cast<size_t>(l) * n + i] : a[static_cast<size_t>(i) * k + l];
        const double y = tb ? b[static_cast<size_t>(j) * k + l] : b[static_cast<size_t>(l) * m + j];
        s += x * y;
      }
      c[static_cast<size_t>(i) * m + j] = s;
    }
  return c;
}

Mat identity(int n) {
  Mat q(static_cast<size_t>(n) * n, 0.0);
  for (int i = 0; i < n; ++i) q[static_cast<size_t>(i) * n + i] = 1.0;
  return q;
}

Mat dbl(const float* x, size_t n) {
  return Mat(x, x + n);
}

// q's columns orthonormal and qᵀ·a·q diagonal, to tol·max|a|
void check_eigenvectors(const std::string& what, const float* a, const float* q, int n,
                        double tol) {
  const size_t nn = static_cast<size_t>(n) * n;
  const Mat ad = dbl(a, nn), qd = dbl(q, nn);
  const Mat qtq = mul(qd, qd, n, n, n, true, false);
  const Mat d = mul(mul(qd, ad, n, n, n, true, false), qd, n, n, n);
  double amax = 0.0;
  for (double x : ad) amax = std::max(amax, std::fabs(x));
  double worst_orth = 0.0, worst_off = 0.0;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const size_t u = static_cast<size_t>(i) * n + j;
      worst_orth = std::max(worst_orth, std::fabs(qtq[u] - (i == j ? 1.0 : 0.0)));
      if (i != j) worst_off = std::max(worst_off, std::fabs(d[u]));
    }
  CHECK_MESSAGE(worst_orth <= 1e-6, what, ": |QᵀQ − I| up to ", worst_orth);
  CHECK_MESSAGE(worst_off <= tol * amax, what, ": off-diagonal of QᵀAQ up to ", worst_off,
                " against max|A| ", amax);
  for (int i = 1; i < n; ++i) {  // ascending eigenvalues
    CHECK(d[static_cast<size_t>(i) * n + i] >=
          d[static_cast<size_t>(i - 1) * n + i - 1] - tol * amax);
  }
}

struct Rotated {
  RotationShape shape;
  std::vector<float> w, m, v, state;
};

Rotated make(int rows, int cols, long max_dim, Rng& rng, long block = 0) {
  Rotated r;
  r.shape = rotation_shape(rows, cols, max_dim, block);
  const size_t n = static_cast<size_t>(rows) * cols;
  r.w = random_vec(n, rng);
  r.m.assign(n, 0.0f);
  r.v.assign(n, 0.0f);
  r.state.assign(r.shape.state_floats(), 0.0f);
  return r;
}

// the same weights, moments and rotation state, bit for bit
void check_same_bits(const Rotated& got, const Rotated& want) {
  CHECK(bitwise_equal(got.w, want.w));
  CHECK(bitwise_equal(got.m, want.m));
  CHECK(bitwise_equal(got.v, want.v));
  CHECK(bitwise_equal(got.state, want.state));
}

// `count` random gradients of n floats
std::vector<std::vector<float>> random_grads(int count, size_t n, Rng& rng) {
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < count; ++t) grads.push_back(random_vec(n, rng));
  return grads;
}

// The blocks of a side of n in blocks of b: first index, size, offset of its matrix.
struct Block {
  int first, size;
  size_t at;
};
std::vector<Block> blocks_of(int n, int b) {
  std::vector<Block> out;
  for (int first = 0, i = 0; first < n; first += b, ++i)
    out.push_back({first, std::min(b, n - first), static_cast<size_t>(i) * b * b});
  return out;
}

// A side's (block-diagonal) basis as a dim × dim matrix, or I where the side does not rotate.
Mat side_basis(bool rotates, int dim, int b, const float* basis) {
  if (!rotates) return identity(dim);
  Mat q(static_cast<size_t>(dim) * dim, 0.0);
  for (const Block& k : blocks_of(dim, b))
    for (int i = 0; i < k.size; ++i)
      for (int j = 0; j < k.size; ++j)
        q[static_cast<size_t>(k.first + i) * dim + k.first + j] =
            basis[k.at + static_cast<size_t>(i) * k.size + j];
  return q;
}

// Runs `updates` updates (refreshing every `every`) and checks each against the reference; in
// blocks of `block` (0: whole sides), the reference's bases are block-diagonal.
void check_updates(int rows, int cols, long max_dim, bool lookahead, int updates, int every,
                   long block = 0) {
  Rng rng(static_cast<uint64_t>(rows * 131 + cols * 7 + (lookahead ? 1 : 0)));
  Rotated x = make(rows, cols, max_dim, rng, block);
  const RotationShape& s = x.shape;
  const int r = rows, c = cols;
  const size_t n = static_cast<size_t>(r) * c;
  AdamWParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.1f;
  // ε well above the rotated moments' rounding noise: at a refresh the rotated gradient is
  // nearly diagonal (its singular values), and AdamW's step would scale the float rounding of
  // the zero entries up to a full step where the double reference has none
  hp.eps = 1e-2f;
  Context ctx(2);
  for (long t = 1; t <= updates; ++t) {
    CAPTURE(t);
    const auto g = random_vec(n, rng, -2.0f, 2.0f);
    const float gs = t == 2 ? 0.5f : 1.0f;  // one clipped update
    const std::vector<float> w0 = x.w, m0 = x.m, v0 = x.v, st0 = x.state;
    const RotationState before = rotation_state(s, const_cast<float*>(st0.data()));
    const RotationState st = rotation_state(s, x.state.data());
    const bool refresh = (t - 1) % every == 0;
    rotated_adamw_update(ctx, x.w.data(), g.data(), x.m.data(), x.v.data(), s, st, hp, t, gs,
                         RotationStep{refresh, lookahead, 0.0f});

    const double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr;
    Mat gd(n);
    for (size_t i = 0; i < n; ++i) gd[i] = static_cast<double>(g[i]) * gs;
    // one side: each block's covariance against the diagonal block of the whole side's, its
    // eigenvectors (refreshed: they diagonalise it; else kept bitwise); returns the side's
    // (block-diagonal) basis, or I where the side does not rotate
    auto check_side = [&](const char* name, bool rotates, int dim, int b, const float* cov_before,
                          const float* cov, const float* basis_before, const float* basis,
                          bool left) {
      if (!rotates) return identity(dim);
      const Mat gg = left ? mul(gd, gd, r, c, r, false, true) : mul(gd, gd, c, r, c, true, false);
      for (const Block& k : blocks_of(dim, b)) {
        CAPTURE(k.first);
        const size_t d2 = static_cast<size_t>(k.size) * k.size;
        Mat want(d2);
        for (int i = 0; i < k.size; ++i)
          for (int j = 0; j < k.size; ++j) {
            const size_t u = static_cast<size_t>(i) * k.size + j;
            want[u] = b2 * cov_before[k.at + u] +
                      (1 - b2) * gg[static_cast<size_t>(k.first + i) * dim + k.first + j];
          }
        check_close(std::string(name) + " covariance",
                    std::vector<float>(cov + k.at, cov + k.at + d2), want, 1e-6, 1e-5);
        if (refresh) {
          check_eigenvectors(std::string(name) + " basis", cov + k.at, basis + k.at, k.size, 1e-5);
        } else {
          CHECK(std::equal(basis + k.at, basis + k.at + d2, basis_before + k.at));
        }
      }
      return side_basis(true, dim, b, basis);
    };
    const Mat ql = check_side("left", s.left, r, s.left_block, before.left_cov, st.left_cov,
                              before.left_basis, st.left_basis, true);
    const Mat qr = check_side("right", s.right, c, s.right_block, before.right_cov, st.right_cov,
                              before.right_basis, st.right_basis, false);
    // m holds M' (the first moment in the basis): AdamW's m in the coordinates is Q_L·M'·Q_Rᵀ
    // with the bases M' was in before the update (zero before the first)
    const Mat ql0 = side_basis(s.left, r, s.left_block, before.left_basis);
    const Mat qr0 = side_basis(s.right, c, s.right_block, before.right_basis);
    const Mat m_before = mul(mul(ql0, dbl(m0.data(), n), r, r, c), qr0, r, c, c, false, true);
    Mat md(n);
    for (size_t i = 0; i < n; ++i) md[i] = b1 * m_before[i] + (1 - b1) * gd[i];
    auto rotate = [&](const Mat& a) { return mul(mul(ql, a, r, r, c, true), qr, r, c, c); };
    const Mat grot = rotate(gd), mrot = rotate(md);
    check_close("M'", x.m, mrot, 1e-6, 1e-5);
    Mat vd(n), ud(n);
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    for (size_t i = 0; i < n; ++i) {
      vd[i] = b2 * v0[i] + (1 - b2) * grot[i] * grot[i];
      const double denom = std::sqrt(vd[i] / bc2) + hp.eps;
      ud[i] = lookahead ? lr * (b1 * mrot[i] / (1 - std::pow(b1, t + 1)) + (1 - b1) * grot[i] / bc1)
                        : lr * mrot[i] / bc1;
      ud[i] /= denom;
    }
    check_close("v", x.v, vd, 1e-7, 1e-4);
    const Mat back = mul(mul(ql, ud, r, r, c), qr, r, c, c, false, true);
    Mat wd(n);
    for (size_t i = 0; i < n; ++i) wd[i] = w0[i] * (1 - lr * hp.weight_decay) - back[i];
    check_close("W", x.w, wd, 1e-6, 1e-5);
  }
}

}  // namespace

TEST_CASE("symmetric_eigenvectors diagonalise a symmetric matrix, eigenvalues ascending") {
  Rng rng(3);
  for (int n : {1, 2, 7, 33}) {
    CAPTURE(n);
    const auto b = random_vec(static_cast<size_t>(n) * n, rng);
    std::vector<float> a(static_cast<size_t>(n) * n);
    for (int i = 0; i < n; ++i)  // a = b·bᵀ, positive semi-definite
      for (int j = 0; j < n; ++j) {
        double s = 0.0;
        for (int k = 0; k < n; ++k) s += double{b[i * n + k]} * b[j * n + k];
        a[static_cast<size_t>(i) * n + j] = static_cast<float>(s);
      }
    std::vector<float> q(a.size());
    symmetric_eigenvectors(a.data(), n, q.data());
    check_eigenvectors("Q", a.data(), q.data(), n, 1e-6);
  }
  std::vector<float> zero(9, 0.0f), q(9);
  symmetric_eigenvectors(zero.data(), 3, q.data());  // a zero matrix: an orthonormal basis
  check_eigenvectors("Q of 0", zero.data(), q.data(), 3, 1e-6);
}

TEST_CASE("rotation_shape: a side rotates up to the limit, and the state's size and layout") {
  const RotationShape both = rotation_shape(6, 4, 8);
  CHECK((both.left && both.right));
  CHECK(both.state_floats() == 2 * 36 + 2 * 16);
  const RotationShape right = rotation_shape(9, 4, 8);
  CHECK((!right.left && right.right));
  CHECK(right.state_floats() == 2 * 16);
  CHECK(!rotation_shape(9, 9, 8).any());
  CHECK(rotation_shape(9, 9, 8).state_floats() == 0);
  std::vector<float> state(both.state_floats());
  const RotationState s = rotation_state(both, state.data());
  CHECK(s.left_cov == state.data());
  CHECK(s.right_cov == state.data() + 36);
  CHECK(s.left_basis == state.data() + 52);
  CHECK(s.right_basis == state.data() + 88);
  const RotationState r = rotation_state(right, state.data());
  CHECK((r.left_cov == nullptr && r.left_basis == nullptr));
  CHECK((r.right_cov == state.data() && r.right_basis == state.data() + 16));
  CHECK_THROWS_AS(rotation_shape(0, 4, 8), CheckFailure);
}

TEST_CASE("rotated AdamW: both sides, five updates against a double reference") {
  check_updates(6, 5, 8, false, 5, 2);
}

TEST_CASE("rotated AdamW: one side (the other above the limit) against a double reference") {
  check_updates(9, 4, 8, false, 4, 3);  // columns only
  check_updates(4, 9, 8, false, 4, 3);  // rows only
}

TEST_CASE("rotation_shape in blocks: block-diagonal sides, a last block of the rest") {
  const RotationShape s = rotation_shape(10, 4, 16, 4);  // rows 4 + 4 + 2, columns whole
  CHECK((s.left_block == 4 && s.right_block == 4));
  CHECK(s.left_floats() == 16 + 16 + 4);
  CHECK(s.right_floats() == 16);
  CHECK(s.state_floats() == 2 * (36 + 16));
  const RotationShape whole = rotation_shape(10, 4, 16, 0);
  CHECK((whole.left_block == 10 && whole.right_block == 4));
  CHECK(whole.state_floats() == 2 * (100 + 16));
  CHECK(rotation_shape(10, 4, 16, 12).left_floats() == 100);  // a block above the side: whole
  CHECK(rotation_shape(10, 4, 8, 4).left_floats() == 0);      // above max_dim: not in blocks
  CHECK_THROWS_AS(rotation_shape(10, 4, 16, -1), CheckFailure);
}

TEST_CASE("rotated AdamW in blocks against a double reference with block-diagonal bases") {
  check_updates(10, 7, 16, false, 4, 2, 4);  // rows 4 + 4 + 2, columns 4 + 3
  check_updates(9, 6, 16, true, 3, 2, 3);    // three blocks of three, two of three
  check_updates(12, 5, 8, false, 3, 2, 4);   // rows above max_dim: the columns in 4 + 1
}

TEST_CASE("rotated AdamW: a block at least the side is the whole side, bit for bit") {
  Rng rng(21);
  const int rows = 12, cols = 9;
  const size_t n = static_cast<size_t>(rows) * cols;
  const auto grads = random_grads(3, n, rng);
  std::vector<Rotated> runs;
  for (long block : {0L, 12L, 40L}) {
    Rng init(22);
    Rotated x = make(rows, cols, 64, init, block);
    Context ctx(2);
    for (long t = 1; t <= 3; ++t)
      rotated_adamw_update(ctx, x.w.data(), grads[static_cast<size_t>(t - 1)].data(), x.m.data(),
                           x.v.data(), x.shape, rotation_state(x.shape, x.state.data()),
                           AdamWParams{}, t, 1.0f, RotationStep{t != 2, false, 0.0f});
    runs.push_back(std::move(x));
  }
  for (size_t k = 1; k < runs.size(); ++k) {
    CAPTURE(k);
    CHECK(bitwise_equal(runs[k].w, runs[0].w));
    CHECK(bitwise_equal(runs[k].state, runs[0].state));
  }
}

TEST_CASE("rotated AdamW with Nesterov's look-ahead against a double reference") {
  check_updates(5, 7, 8, true, 4, 2);
}

TEST_CASE("rotated_adamw_direction: AdamW's step in the rotated basis against a double reference") {
  Rng rng(5);
  for (long max_dim : {8L, 5L}) {  // both sides; the rows only (the 7 columns above 5)
    CAPTURE(max_dim);
    Rotated x = make(5, 7, max_dim, rng);
    Context ctx(2);
    AdamWParams hp;
    hp.eps = 1e-2f;
    for (long t = 1; t <= 2; ++t) {
      const auto g = random_vec(35, rng);
      rotated_adamw_update(ctx, x.w.data(), g.data(), x.m.data(), x.v.data(), x.shape,
                           rotation_state(x.shape, x.state.data()), hp, t, 1.0f,
                           RotationStep{t == 1, false, 0.0f});
    }
    const RotationState st = rotation_state(x.shape, x.state.data());
    const float bc1 = 0.19f, bc2_sqrt = 0.3122f;
    std::vector<float> dir(35);
    rotated_adamw_direction(ctx, x.m.data(), x.v.data(), x.shape, st, bc1, bc2_sqrt, hp.eps,
                            dir.data());
    const Mat ql = x.shape.left ? dbl(st.left_basis, 25) : identity(5);
    const Mat qr = x.shape.right ? dbl(st.right_basis, 49) : identity(7);
    const Mat mrot = dbl(x.m.data(), 35);  // M', in the basis already
    Mat u(35);
    for (size_t i = 0; i < 35; ++i)
      u[i] = (mrot[i] / bc1) / (std::sqrt(double{x.v[i]}) / bc2_sqrt + hp.eps);
    check_close("direction", dir, mul(mul(ql, u, 5, 5, 7), qr, 5, 7, 7, false, true), 1e-6, 1e-5);
  }
}

TEST_CASE("rotated AdamW: the same bits for any thread count") {
  Rng rng(11);
  const int rows = 48, cols = 40;
  const size_t n = static_cast<size_t>(rows) * cols;
  const auto grads = random_grads(4, n, rng);
  for (long block : {0L, 16L}) {
    CAPTURE(block);
    Rng init(12);
    const Rotated start = make(rows, cols, 64, init, block);
    std::vector<Rotated> runs;
    for (int threads : {1, 2, 3}) {
      Context ctx(threads);
      Rotated x = start;
      for (long t = 1; t <= 4; ++t) {
        rotated_adamw_update(ctx, x.w.data(), grads[static_cast<size_t>(t - 1)].data(), x.m.data(),
                             x.v.data(), x.shape, rotation_state(x.shape, x.state.data()),
                             AdamWParams{}, t, t == 3 ? 0.25f : 1.0f,
                             RotationStep{t % 2 == 1, t == 4, 0.0f});
      }
      runs.push_back(std::move(x));
    }
    for (size_t k = 1; k < runs.size(); ++k) {
      CAPTURE(k);
      check_same_bits(runs[k], runs[0]);
    }
    CHECK(!bitwise_equal(runs[0].w, start.w));
  }
}

TEST_CASE("rotated AdamW refuses a matrix that does not rotate and a mismatched state") {
  Context ctx(1);
  std::vector<float> w(16), g(16), m(16), v(16), state(64);
  const RotationShape none = rotation_shape(4, 4, 2);
  CHECK_THROWS_AS(rotated_adamw_update(ctx, w.data(), g.data(), m.data(), v.data(), none, {},
                                       AdamWParams{}, 1, 1.0f, {}),
                  CheckFailure);
  const RotationShape both = rotation_shape(4, 4, 4);
  CHECK_THROWS_AS(rotated_adamw_update(ctx, w.data(), g.data(), m.data(), v.data(), both, {},
                                       AdamWParams{}, 1, 1.0f, {}),
                  CheckFailure);
}

TEST_CASE("rotation_panel_rows: whole matrices where small, panels that keep gemm's path") {
  // a rows' side that rotates whole: one panel
  CHECK(rotation_panel_rows(rotation_shape(200, 64, 1024)) == 200);
  // products below gemm's split threshold already: one panel
  CHECK(rotation_panel_rows(rotation_shape(3000, 24, 32)) == 3000);
  // GPT-2's embedding, its columns whole: panels of the default size (4 Mi floats / 3 / 768
  // rows, rounded down to a multiple of 96)
  CHECK(rotation_panel_rows(rotation_shape(50257, 768, 1024)) == 1728);
  // in blocks of 32: each 32-column product of a panel must keep 8 Mi multiply-adds, 8192 rows,
  // rounded up to 8256 (86 · 96)
  CHECK(rotation_panel_rows(rotation_shape(50257, 768, 1024, 32)) == 8256);
  // a ragged last block of the columns decides: 810 = 25 · 32 + 10, so ⌈8 Mi / 10²⌉ = 83887
  CHECK(rotation_panel_rows(rotation_shape(200000, 810, 1024, 32)) ==
        83904);  // rows, rounded up to 96
  // a panel asked for: rounded down to the unit (the rows' blocks and 96), at least one unit
  RotationShape s;
  s.rows = 300;
  s.cols = 40;
  s.left = true;
  s.left_block = 12;  // unit lcm(12, 96) = 96
  CHECK(rotation_panel_rows(s, 100) == 96);
  CHECK(rotation_panel_rows(s, 10) == 96);
  CHECK(rotation_panel_rows(s, 200) == 192);
  CHECK(rotation_panel_rows(s, 1000) == 300);
  s.left_block = 40;  // unit lcm(40, 96) = 480 ≥ rows
  CHECK(rotation_panel_rows(s, 100) == 300);
  CHECK_THROWS_AS(rotation_panel_rows(s, -1), CheckFailure);
}

TEST_CASE("rotated AdamW and its direction in panels of rows: the bits of the whole matrix") {
  // Made by hand so that panels of 96 rows are allowed: the rows in blocks of 8 (the last of
  // 4), the columns either whole (512: a 96-row panel's product has 96·512² multiply-adds) or
  // not rotating. Panels of 96 → 96, 96, 108 rows (the last takes the rest).
  for (bool right : {true, false}) {
    CAPTURE(right);
    RotationShape shape;
    shape.rows = 300;
    shape.cols = right ? 512 : 40;
    shape.left = true;
    shape.left_block = 8;
    shape.right = right;
    shape.right_block = shape.cols;
    REQUIRE(rotation_panel_rows(shape, 96) == 96);
    const size_t n = static_cast<size_t>(shape.rows) * shape.cols;
    Rng rng(31);
    const auto grads = random_grads(3, n, rng);
    Rotated start;
    start.shape = shape;
    start.w = random_vec(n, rng);
    start.m.assign(n, 0.0f);
    start.v.assign(n, 0.0f);
    start.state.assign(shape.state_floats(), 0.0f);
    std::vector<Rotated> runs;
    std::vector<std::vector<float>> directions;
    for (long panel : {0L, 96L, 1L << 30}) {
      CAPTURE(panel);
      Rotated x = start;
      Context ctx(2);
      for (long t = 1; t <= 3; ++t)
        rotated_adamw_update(ctx, x.w.data(), grads[static_cast<size_t>(t - 1)].data(), x.m.data(),
                             x.v.data(), shape, rotation_state(shape, x.state.data()),
                             AdamWParams{}, t, t == 2 ? 0.5f : 1.0f,
                             RotationStep{t != 2, t == 3, 0.0f, panel});
      std::vector<float> d(n);  // xpipe's direction from the state after the updates
      rotated_adamw_direction(ctx, x.m.data(), x.v.data(), shape,
                              rotation_state(shape, x.state.data()), 0.271f, 0.0548f, 1e-8f,
                              d.data(), panel);
      directions.push_back(std::move(d));
      runs.push_back(std::move(x));
    }
    for (size_t k = 1; k < runs.size(); ++k) {
      CAPTURE(k);
      check_same_bits(runs[k], runs[0]);
      CHECK(bitwise_equal(directions[k], directions[0]));
    }
    CHECK(!bitwise_equal(runs[0].w, start.w));
    // xpipe's whole prediction: the bits of its last step along the direction computed apart
    WeightPrediction wp;
    wp.k = 0.03f;
    wp.wd = 0.1f;
    wp.bc1 = 0.271f;
    wp.bc2_sqrt = 0.0548f;
    wp.eps = 1e-8f;
    Context ctx(2);
    const Rotated& x = runs[0];
    std::vector<float> predicted(n), along(n);
    rotated_xpipe_predict(ctx, predicted.data(), x.w.data(), x.m.data(), x.v.data(), shape,
                          rotation_state(shape, const_cast<float*>(x.state.data())), wp);
    xpipe_predict_along(ctx, along.data(), x.w.data(), directions[0].data(),
                        static_cast<int64_t>(n), wp);
    CHECK(bitwise_equal(predicted, along));
    CHECK(!bitwise_equal(predicted, x.w));
  }
}
