#include <gtest/gtest.h>

#include <cmath>

#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/reduce.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/core/varn.hpp"
#include "kvarn/data/error.hpp"
#include "test_util.hpp"

namespace kvarn {
namespace {

TEST(Varn, NeverEndsAboveIdentityImbalance) {
  for (int seed = 0; seed < 40; ++seed) {
    for (auto [r, c] : {std::pair{128, 128}, {64, 128}, {128, 32}, {256, 64}}) {
      Matrix t = testing::random_kv(r, c, seed, seed % 2 == 0);
      std::vector<float> out(t.size());
      VarnResult res = variance_normalize(t.data(), r, c, VarnParams{}, out.data());
      ASSERT_LE(res.imbalance_after, res.imbalance_before);
      EXPECT_NEAR(imbalance(out.data(), r, c), res.imbalance_after, 1e-4 * res.imbalance_after);
      for (float s : res.s_row) ASSERT_TRUE(s >= std::exp(-0.3f) * 0.9999f && s <= std::exp(10.0f));
      for (float s : res.s_col) ASSERT_TRUE(s >= std::exp(-0.3f) * 0.9999f && s <= std::exp(10.0f));
    }
  }
}

TEST(Varn, ReducesImbalanceOnOutlierTiles) {
  Matrix t = testing::random_kv(128, 128, 11, true);
  std::vector<float> out(t.size());
  VarnResult res = variance_normalize(t.data(), 128, 128, VarnParams{}, out.data());
  EXPECT_LT(res.imbalance_after, 0.5f * res.imbalance_before);
  EXPECT_GT(res.best_iter, 0);
  EXPECT_EQ(res.trace.size(), 8u);
}

TEST(Varn, ZeroIterationsIsIdentity) {
  Matrix t = testing::random_kv(64, 64, 3);
  std::vector<float> out(t.size());
  VarnParams p;
  p.iters = 0;
  VarnResult res = variance_normalize(t.data(), 64, 64, p, out.data());
  for (int i = 0; i < t.size(); ++i) ASSERT_EQ(out[i], t.data()[i]);
  EXPECT_EQ(res.best_iter, 0);
}

// Hand-computed case: an 8x8 tile whose rows are a pattern times row factors. Column stds are
// then equal up to the row profile; one iteration must divide every column by its std (clipped
// to >= e^-0.3) and every row by the std of the column-normalized row.
TEST(Varn, MatchesHandComputedFirstIteration) {
  const int n = 8;
  Matrix t(n, n);
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < n; ++c)
      t(r, c) = static_cast<float>((r + 1) * ((c * 3 + r) % 5 - 2)) * (c + 1);
  VarnParams p;
  p.iters = 1;
  std::vector<float> out(t.size());
  VarnResult res = variance_normalize(t.data(), n, n, p, out.data());
  // Independent double computation of the first iteration.
  std::vector<double> sc(n), sr(n);
  for (int c = 0; c < n; ++c) {
    double m = 0, v = 0;
    for (int r = 0; r < n; ++r) m += t(r, c);
    m /= n;
    for (int r = 0; r < n; ++r) v += (t(r, c) - m) * (t(r, c) - m);
    double sd = std::clamp(std::sqrt(v / (n - 1)), 1e-3, 1e3);
    sc[c] = std::exp(std::clamp(std::log(sd), -0.3, 10.0));
  }
  for (int r = 0; r < n; ++r) {
    double m = 0, v = 0;
    for (int c = 0; c < n; ++c) m += t(r, c) / sc[c];
    m /= n;
    for (int c = 0; c < n; ++c) v += (t(r, c) / sc[c] - m) * (t(r, c) / sc[c] - m);
    double sd = std::clamp(std::sqrt(v / (n - 1)), 1e-3, 1e3);
    sr[r] = std::exp(std::clamp(std::log(sd), -0.3, 10.0));
  }
  if (res.best_iter == 1) {
    for (int c = 0; c < n; ++c) EXPECT_NEAR(res.s_col[c], sc[c], 1e-5 * sc[c]);
    for (int r = 0; r < n; ++r) EXPECT_NEAR(res.s_row[r], sr[r], 1e-5 * sr[r]);
  } else {
    // Identity kept: then the iteration must really have been worse.
    ASSERT_EQ(res.best_iter, 0);
    EXPECT_GT(res.trace[0], res.imbalance_before);
  }
  EXPECT_GT(res.imbalance_before, 0.0f);
}

TEST(Varn, DegenerateTilesStayFinite) {
  const int n = 64;
  Matrix zero = Matrix::Zero(n, n);
  Matrix constant_rows(n, n), constant_cols(n, n), outlier = testing::random_kv(n, n, 9, false);
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < n; ++c) {
      constant_rows(r, c) = static_cast<float>(r);
      constant_cols(r, c) = static_cast<float>(c);
    }
  outlier(5, 7) = 60000.0f;
  Matrix subnormal = testing::random_kv(n, n, 4, false) * 1e-6f;
  for (const Matrix* m : {&zero, &constant_rows, &constant_cols, &outlier, &subnormal}) {
    std::vector<float> out(m->size());
    VarnResult res = variance_normalize(m->data(), n, n, VarnParams{}, out.data());
    for (float v : out) ASSERT_TRUE(std::isfinite(v));
    ASSERT_TRUE(std::isfinite(res.imbalance_after));
    ASSERT_LE(res.imbalance_after, res.imbalance_before);
  }
}

// The AVX2 + FMA build divides by the scales without the divider; it must return the baseline's
// bits on every tile: in range (the fast path; hard mantissas, +0, fp16-subnormal multiples of
// 2^-24) and with -0, tiny or huge entries or scale bounds beyond 2^60 (the divider path).
TEST(Varn, FmaBuildIsBitIdenticalToBaseline) {
  if (!varn_fma_available()) GTEST_SKIP() << "this CPU has no AVX2 + FMA: nothing to compare";
  Rng rng(5);
  auto hard = [&](float x) {  // mantissas next to a power of two or all ones
    std::uint32_t u = float_bits(x);
    const std::uint32_t low = static_cast<std::uint32_t>(rng.next() & 0xff);
    u = (u & 0xff800000u) | (rng.next() % 2 ? low : 0x7fffffu - low);
    return bits_float(u);
  };
  int cases = 0;
  for (int seed = 0; seed < 24; ++seed) {
    for (auto [r, c] : {std::pair{128, 128}, {64, 128}, {128, 64}, {16, 8}, {256, 64}}) {
      Matrix t = testing::random_kv(r, c, 1000 + seed, seed % 2 == 0);
      VarnParams p;
      const int variant = seed % 8;
      for (Eigen::Index i = 0; i < t.size(); ++i) {
        float& x = t.data()[i];
        if (variant == 1 && i % 3 == 0) x = hard(x);
        if (variant == 2 && i % 97 == 0) x = 0.0f;               // +0: fast path
        if (variant == 3 && i == t.size() / 2) x = -0.0f;        // -0: divider
        if (variant == 4 && i % 11 == 0) x *= 1e-30f;            // tiny: divider
        if (variant == 5 && i % 13 == 0) x = std::ldexp(x, 70);  // huge: divider
        if (variant == 6 && i % 5 == 0) x = std::ldexp(1.0f, -24) * static_cast<float>(i % 7);
      }
      if (variant == 7) p.log_max = 45.0f;  // scales up to e^45 > 2^60: divider
      std::vector<float> out_b(t.size()), out_f(t.size());
      const VarnResult b =
          variance_normalize(t.data(), r, c, p, out_b.data(), VarnBuild::kBaseline);
      const VarnResult f = variance_normalize(t.data(), r, c, p, out_f.data(), VarnBuild::kFma);
      for (std::size_t i = 0; i < out_b.size(); ++i)
        ASSERT_EQ(float_bits(out_f[i]), float_bits(out_b[i]))
            << r << "x" << c << " seed " << seed << " at " << i;
      for (int i = 0; i < c; ++i) ASSERT_EQ(float_bits(f.s_col[i]), float_bits(b.s_col[i]));
      for (int i = 0; i < r; ++i) ASSERT_EQ(float_bits(f.s_row[i]), float_bits(b.s_row[i]));
      ASSERT_EQ(f.trace.size(), b.trace.size());
      for (std::size_t i = 0; i < b.trace.size(); ++i)
        ASSERT_EQ(float_bits(f.trace[i]), float_bits(b.trace[i]));
      EXPECT_EQ(f.best_iter, b.best_iter);
      ++cases;
    }
  }
  EXPECT_EQ(cases, 24 * 5);
}

// balanced is T / s_col / s_row, divided in that order, whether the best step is the last one
// (its T / sc / sr is kept) or an earlier one (recomputed from the chosen scales).
// The magnitudes under which a division by a scale may skip the divider: every dividend T,
// T / s_col, T / s_col / s_row within [2^-60, 2^60] for scales in [e^log_min / 2, e^log_max * 2].
TEST(Varn, DivisionBoundsFollowTheScaleRange) {
  VarnParams p;  // log_min -0.3, log_max 10
  const VarnDivisionBounds b = varn_division_bounds(p);
  const double s_lo = std::exp(static_cast<double>(p.log_min)) / 2,
               s_hi = std::exp(static_cast<double>(p.log_max)) * 2;
  EXPECT_DOUBLE_EQ(b.lo, std::ldexp(s_hi * s_hi, -60));
  EXPECT_DOUBLE_EQ(b.hi, std::ldexp(s_lo * s_lo, 60));
  // every finite nonzero fp16 magnitude qualifies with the defaults (what the GPU store relies on
  // for speed, not for correctness)
  EXPECT_LT(b.lo, std::ldexp(1.0, -24));
  EXPECT_GT(b.hi, 65504.0);
  p.log_max = 45.0f;  // scales up to e^45 > 2^60: never
  const VarnDivisionBounds never = varn_division_bounds(p);
  EXPECT_GT(never.lo, never.hi);
  p = VarnParams{};
  p.log_min = -45.0f;  // scales down to e^-45 < 2^-60: never
  EXPECT_GT(varn_division_bounds(p).lo, varn_division_bounds(p).hi);
}

TEST(Varn, BalancedIsTheTileDividedByTheChosenScales) {
  int last = 0, earlier = 0;
  for (int seed = 0; seed < 40; ++seed) {
    Matrix t = testing::random_kv(64, 128, 500 + seed, seed % 2 == 0);
    VarnParams p;
    p.iters = 1 + seed % 12;
    std::vector<float> out(t.size());
    const VarnResult res = variance_normalize(t.data(), 64, 128, p, out.data());
    (res.best_iter == p.iters ? last : earlier) += 1;
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < 128; ++c)
        ASSERT_EQ(float_bits(out[static_cast<std::size_t>(r) * 128 + c]),
                  float_bits((t(r, c) / res.s_col[c]) / res.s_row[r]))
            << "seed " << seed << " at " << r << "," << c;
  }
  EXPECT_GT(last, 0);
  EXPECT_GT(earlier, 0);
}

TEST(Varn, OutputOverlappingTheTileIsAnError) {
  std::vector<float> t(128, 1.0f);
  EXPECT_THROW(variance_normalize(t.data(), 8, 8, VarnParams{}, t.data() + 32), Error);
}

TEST(Varn, FmaBuildOnACpuWithoutItIsAnError) {
  if (varn_fma_available()) GTEST_SKIP() << "this CPU has AVX2 + FMA";
  std::vector<float> t(64, 1.0f), out(64);
  EXPECT_THROW(variance_normalize(t.data(), 8, 8, VarnParams{}, out.data(), VarnBuild::kFma),
               Error);
}

}  // namespace
}  // namespace kvarn
