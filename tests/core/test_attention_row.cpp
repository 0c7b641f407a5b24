// The shared per-row attention formulas against closed forms (the CPU and GPU paths both use them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kvarn/core/attention_row.hpp"

namespace kvarn {
namespace {

namespace ar = attention_row;

// Σ_j term(j) of a row in key order, as the CPU path sums them.
struct RowSums {
  double lse = 0, lseh = 0, kl = 0, js = 0, abs = 0, sq = 0;
};

RowSums row_sums(const std::vector<double>& s, const std::vector<double>& sh) {
  auto lse_of = [](const std::vector<double>& x) {
    double mx = x[0];
    for (double v : x) mx = ar::max_of(mx, v);
    double sum = 0;
    for (double v : x) sum += std::exp(v - mx);
    return ar::lse_finish(mx, sum);
  };
  RowSums r;
  r.lse = lse_of(s);
  r.lseh = lse_of(sh);
  const double l2 = ar::ln2();
  for (std::size_t j = 0; j < s.size(); ++j) {
    const double ls = s[j] - r.lse, lsh = sh[j] - r.lseh;
    r.kl += ar::kl_term(std::exp(ls), ls, lsh);
    r.js += ar::js_term(std::exp(ls), std::exp(lsh), ls, lsh, l2);
    r.abs += std::fabs(sh[j] - s[j]);
    r.sq += (sh[j] - s[j]) * (sh[j] - s[j]);
  }
  return r;
}

// js_term computes log1p(exp(-|δ|)) once for softplus(δ) and softplus(−δ): bit for bit the
// two-call formula, signed zeros, underflow and overflow included.
TEST(AttentionRow, JsTermEqualsTheTwoSoftplusFormulaBitForBit) {
  const double l2 = ar::ln2();
  const double deltas[] = {0.0, -0.0, 1e-300, -1e-300, 1e-9, -1e-9, 0.37, -0.37, 3.0, -3.0,
                           40.0, -40.0, 745.5, -745.5, 800.0, -800.0};
  for (double ls : {-0.5, -30.0}) {
    for (double dlt : deltas) {
      const double lsh = ls + dlt, d = lsh - ls;
      const double p = std::exp(ls), ph = std::exp(lsh);
      const double two_calls = p * (l2 - ar::softplus(d)) + ph * (l2 - ar::softplus(-d));
      const double got = ar::js_term(p, ph, ls, lsh, l2);
      EXPECT_EQ(std::memcmp(&got, &two_calls, sizeof got), 0) << ls << " " << dlt << ": " << got
                                                               << " vs " << two_calls;
    }
  }
}

TEST(AttentionRow, Ln2AndSoftplus) {
  EXPECT_NEAR(ar::ln2(), std::log(2.0), 1e-16);
  EXPECT_EQ(ar::ln2() - ar::softplus(0.0), 0.0);  // identical rows give JS exactly 0
  for (double x : {-40.0, -3.0, -1e-3, 1e-3, 2.5, 40.0}) {
    EXPECT_NEAR(ar::softplus(x), std::log1p(std::exp(x)), 1e-15 * (1 + std::fabs(x))) << x;
    EXPECT_NEAR(ar::softplus(x) - ar::softplus(-x), x, 1e-14 * (1 + std::fabs(x))) << x;
  }
  EXPECT_EQ(ar::softplus(800.0), 800.0);  // no exp overflow
  EXPECT_GT(ar::softplus(-800.0), -1.0);  // underflows to 0, never NaN
  // Same choice as std::max / std::clamp, signed zeros included (the CPU path used those).
  EXPECT_EQ(std::signbit(ar::max_of(-0.0, 0.0)), std::signbit(std::max(-0.0, 0.0)));
  EXPECT_EQ(std::signbit(ar::max_of(0.0, -0.0)), std::signbit(std::max(0.0, -0.0)));
  EXPECT_EQ(std::signbit(ar::clamp_to(-0.0, 0.0, 1.0)), std::signbit(std::clamp(-0.0, 0.0, 1.0)));
  EXPECT_EQ(ar::max_of(1.0, 2.0), 2.0);
  EXPECT_EQ(ar::max_of(2.0, 1.0), 2.0);
  EXPECT_EQ(ar::clamp_to(-1.0, 0.0, 1.0), 0.0);
  EXPECT_EQ(ar::clamp_to(2.0, 0.0, 1.0), 1.0);
  EXPECT_EQ(ar::clamp_to(0.25, 0.0, 1.0), 0.25);
}

TEST(AttentionRow, KlJsOfReversedLogitsByHand) {
  // p = softmax(1,2,3,4), p̂ = p reversed: log(p_i / p̂_i) = i − (5 − i).
  const std::vector<double> s = {1, 2, 3, 4}, sh = {4, 3, 2, 1};
  double z = 0, num = 0, js = 0;
  for (int i = 1; i <= 4; ++i) z += std::exp(i), num += (2.0 * i - 5.0) * std::exp(i);
  for (int i = 1; i <= 4; ++i) {
    const double p = std::exp(i) / z, ph = std::exp(5 - i) / z, m = 0.5 * (p + ph);
    js += 0.5 * (p * std::log(p / m) + ph * std::log(ph / m));
  }
  const RowSums r = row_sums(s, sh);
  EXPECT_NEAR(r.lse, std::log(z), 1e-15);
  EXPECT_NEAR(ar::finish_kl(r.kl), num / z, 1e-14);
  EXPECT_NEAR(ar::finish_js(r.js, ar::ln2()), js, 1e-14);
  // Logit error: |ŝ − s| = 3, 1, 1, 3.
  EXPECT_EQ(ar::finish_mae(r.abs, 4), 2.0);
  EXPECT_EQ(ar::finish_rmse(r.sq, 4), std::sqrt(5.0));
  // Identical rows: every metric exactly 0 (no exp/log round trip in KL or JS).
  const std::vector<double> row = {0.3, -7.25, 11.0, 2.0, 2.0};
  const RowSums z0 = row_sums(row, row);
  EXPECT_EQ(ar::finish_kl(z0.kl), 0.0);
  EXPECT_EQ(ar::finish_js(z0.js, ar::ln2()), 0.0);
  EXPECT_EQ(ar::finish_mae(z0.abs, 5), 0.0);
  // Disjoint supports (p̂ ≈ 0 where p ≈ 1): JS approaches ln 2 and never exceeds it.
  const RowSums far = row_sums({0.0, -800.0}, {-800.0, 0.0});
  EXPECT_NEAR(ar::finish_js(far.js, ar::ln2()), ar::ln2(), 1e-15);
  EXPECT_LE(ar::finish_js(far.js, ar::ln2()), ar::ln2());
  EXPECT_TRUE(std::isfinite(ar::finish_kl(far.kl)));
}

TEST(AttentionRow, FinishersClampRounding) {
  EXPECT_EQ(ar::finish_kl(-1e-18), 0.0);
  EXPECT_EQ(ar::finish_kl(3e-7), 3e-7);
  EXPECT_EQ(ar::finish_js(-1e-18, ar::ln2()), 0.0);
  EXPECT_EQ(ar::finish_js(2 * ar::ln2() + 1e-15, ar::ln2()), ar::ln2());
  EXPECT_EQ(ar::finish_js(0.5, ar::ln2()), 0.25);
}

TEST(AttentionRow, OutputNmseZeroConvention) {
  EXPECT_EQ(ar::output_nmse(0.0, 0.0), 0.0);
  EXPECT_EQ(ar::output_nmse(1.0, 0.0), std::numeric_limits<double>::infinity());
  EXPECT_EQ(ar::output_nmse(2.0, 4.0), 0.5);
  EXPECT_EQ(ar::output_nmse(0.0, 4.0), 0.0);
}

TEST(AttentionRow, TopkTieRuleAndOverlap) {
  EXPECT_TRUE(ar::ranks_before(2.0, 9, 1.0, 0));  // larger logit first
  EXPECT_TRUE(ar::ranks_before(1.0, 3, 1.0, 5));  // tie: lower index first
  EXPECT_FALSE(ar::ranks_before(1.0, 5, 1.0, 3));
  EXPECT_FALSE(ar::ranks_before(1.0, 3, 1.0, 3));  // strict
  // The (+inf, -1) start of the GPU selection ranks before every finite logit.
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(ar::ranks_before(inf, -1, 1e300, 0));
  const int a[] = {9, 8, 7, 6}, b[] = {0, 8, 7, 9};
  EXPECT_TRUE(ar::prefix_contains(b, 4, 9));
  EXPECT_FALSE(ar::prefix_contains(b, 3, 9));
  EXPECT_EQ(ar::overlap_count(a, b, 1), 0);
  EXPECT_EQ(ar::overlap_count(a, b, 3), 2);  // {9,8,7} vs {0,8,7}
  EXPECT_EQ(ar::overlap_count(a, b, 4), 3);
  EXPECT_EQ(ar::topk_overlap_value(2, 3, 10), 2.0 / 3.0);
  EXPECT_EQ(ar::topk_overlap_value(0, 10, 10), 1.0);  // row not longer than k
  EXPECT_EQ(ar::topk_overlap_value(0, 32, 5), 1.0);
}

}  // namespace
}  // namespace kvarn
