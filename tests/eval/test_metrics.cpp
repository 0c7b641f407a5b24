#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "test_util.hpp"
#include "kvarn/eval/metrics.hpp"

namespace kvarn {
namespace {

using testing::add_noise;
using testing::random_kv;

ReconstructionMetrics run(const Matrix& x, const Matrix& y, const std::uint8_t* mask = nullptr) {
  return reconstruction_metrics(x.data(), y.data(), static_cast<int>(x.rows()),
                                static_cast<int>(x.cols()), {}, mask);
}

void expect_no_nan(const ReconstructionMetrics& m) {
  const std::string s = nlohmann::json(m).dump();
  EXPECT_EQ(s.find("nan"), std::string::npos) << s;
  EXPECT_EQ(s.find("null"), std::string::npos) << s;
}

// numpy "linear" percentile by full sort.
double sorted_percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double pos = p * (v.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(pos));
  const double frac = pos - lo;
  return lo + 1 < v.size() ? v[lo] + frac * (v[lo + 1] - v[lo]) : v[lo];
}

TEST(Metrics, IdentityIsZeroError) {
  const Matrix x = random_kv(128, 128, 1);
  const ReconstructionMetrics m = run(x, x);
  EXPECT_EQ(m.rows, 128);
  EXPECT_EQ(m.sum_sq_err, 0.0);
  EXPECT_EQ(m.mse, 0.0);
  EXPECT_EQ(m.nmse, 0.0);
  EXPECT_EQ(m.rel_fro, 0.0);
  EXPECT_EQ(m.snr_db, kSnrCapDb);  // documented sentinel for an exact reconstruction
  EXPECT_EQ(m.max_abs, 0.0);
  EXPECT_EQ(m.p99_abs, 0.0);
  EXPECT_EQ(m.p999_abs, 0.0);
  EXPECT_NEAR(m.mean_cos, 1.0, 1e-12);
  EXPECT_NEAR(m.min_cos, 1.0, 1e-12);
  EXPECT_EQ(m.magnitude_err, 0.0);
  EXPECT_LE(m.direction_err, 1e-12 * m.sum_sq_ref);
  EXPECT_NEAR(m.norm_ratio_mean, 1.0, 1e-12);
  EXPECT_NEAR(m.norm_ratio_p1, 1.0, 1e-12);
  EXPECT_NEAR(m.norm_ratio_p99, 1.0, 1e-12);
  ASSERT_EQ(m.nmse_per_channel.size(), 128u);
  ASSERT_EQ(m.nmse_per_token.size(), 128u);
  for (double v : m.nmse_per_channel) EXPECT_EQ(v, 0.0);
  for (double v : m.nmse_per_token) EXPECT_EQ(v, 0.0);
  expect_no_nan(m);
}

TEST(Metrics, KnownScalingIsPureMagnitudeError) {
  const Matrix x = random_kv(128, 64, 2);
  const Matrix y = x * 1.1f;
  const ReconstructionMetrics m = run(x, y);
  EXPECT_NEAR(m.nmse, 0.01, 1e-6);
  EXPECT_NEAR(m.snr_db, 20.0, 1e-3);
  EXPECT_NEAR(m.rel_fro, 0.1, 1e-6);
  EXPECT_NEAR(m.magnitude_err, m.sum_sq_err, 1e-6 * m.sum_sq_err);
  EXPECT_LT(m.direction_err, 1e-8 * m.magnitude_err);
  EXPECT_NEAR(m.magnitude_share, 1.0, 1e-8);
  for (double s : m.top_magnitude_share) EXPECT_NEAR(s, 1.0, 1e-8);
  EXPECT_NEAR(m.norm_ratio_mean, 1.1, 1e-6);
  EXPECT_NEAR(m.norm_ratio_p1, 1.1, 1e-6);
  EXPECT_NEAR(m.norm_ratio_p99, 1.1, 1e-6);
  EXPECT_NEAR(m.mean_cos, 1.0, 1e-12);
  for (double v : m.nmse_per_token) EXPECT_NEAR(v, 0.01, 1e-6);
  for (double v : m.nmse_per_channel) EXPECT_NEAR(v, 0.01, 1e-6);
}

TEST(Metrics, NormPreservingRotationIsPureDirectionError) {
  // x̂_t = cos φ x_t + sin φ ‖x_t‖ u_t with u_t ⟂ x_t, ‖u_t‖ = 1: same norm, angle φ.
  const int rows = 64, cols = 32;
  const double phi = 0.3;
  Rng rng(3);
  Matrix x(rows, cols), y(rows, cols);
  for (int r = 0; r < rows; ++r) {
    std::vector<double> a(cols), u(cols);
    for (auto& v : a) v = rng.normal();
    for (auto& v : u) v = rng.normal();
    double aa = 0, au = 0;
    for (int c = 0; c < cols; ++c) aa += a[c] * a[c], au += a[c] * u[c];
    double uu = 0;
    for (int c = 0; c < cols; ++c) u[c] -= au / aa * a[c], uu += u[c] * u[c];
    for (int c = 0; c < cols; ++c) {
      x(r, c) = static_cast<float>(a[c]);
      y(r, c) = static_cast<float>(std::cos(phi) * a[c] +
                                   std::sin(phi) * std::sqrt(aa) * u[c] / std::sqrt(uu));
    }
  }
  const ReconstructionMetrics m = run(x, y);
  EXPECT_LT(m.magnitude_share, 1e-6);
  EXPECT_NEAR(m.direction_err, m.sum_sq_err, 1e-5 * m.sum_sq_err);
  // ‖x − x̂‖² = 2‖x‖²(1 − cos φ) for every row.
  EXPECT_NEAR(m.nmse, 2.0 * (1.0 - std::cos(phi)), 1e-5);
  EXPECT_NEAR(m.mean_cos, std::cos(phi), 1e-6);
  EXPECT_NEAR(m.min_cos, std::cos(phi), 1e-6);
  EXPECT_NEAR(m.norm_ratio_mean, 1.0, 1e-6);
  for (double s : m.top_magnitude_share) EXPECT_LT(s, 1e-5);
}

TEST(Metrics, TopRowsMagnitudeShare) {
  // 200 rows: row 7 has the largest error, pure magnitude (2x); the rest small direction errors.
  const int rows = 200, cols = 8;
  Matrix x = Matrix::Zero(rows, cols), y = Matrix::Zero(rows, cols);
  for (int r = 0; r < rows; ++r) {
    x(r, 0) = 1.0f;
    y(r, 0) = 1.0f;
    y(r, 1) = 0.01f * static_cast<float>(1 + r % 5);  // direction + small magnitude
  }
  x(7, 0) = 1.0f;
  y(7, 0) = 3.0f;
  y(7, 1) = 0.0f;
  const ReconstructionMetrics m = run(x, y);
  // top 0.1 % and 1 % of 200 rows: ceil -> 1 and 2 rows; 5 % -> 10 rows.
  EXPECT_NEAR(m.top_magnitude_share[0], 1.0, 1e-12);
  // Second largest rows have y1 = 0.05: ‖x̂‖ = sqrt(1.0025); magnitude share within that row.
  const double nh = std::sqrt(1.0 + 0.05 * 0.05);
  const double mag = (nh - 1.0) * (nh - 1.0), err = 0.05 * 0.05;
  const double two_rows = (4.0 + mag) / (4.0 + err);
  EXPECT_NEAR(m.top_magnitude_share[1], two_rows, 1e-6);
  const double ten_rows = (4.0 + 9 * mag) / (4.0 + 9 * err);
  EXPECT_NEAR(m.top_magnitude_share[2], ten_rows, 1e-6);
}

TEST(Metrics, ZeroRowsAndZeroSignalNeverNaN) {
  Matrix x = Matrix::Zero(4, 8), y = Matrix::Zero(4, 8);
  // Both all zero: exact.
  ReconstructionMetrics m = run(x, y);
  EXPECT_EQ(m.nmse, 0.0);
  EXPECT_EQ(m.snr_db, kSnrCapDb);
  EXPECT_EQ(m.mean_cos, 1.0);
  EXPECT_EQ(m.norm_ratio_mean, 1.0);
  EXPECT_EQ(m.zero_ref_rows, 4);
  expect_no_nan(m);
  // Zero signal, non-zero reconstruction: NMSE +inf, SNR -cap, JSON "inf".
  y(1, 3) = 2.0f;
  m = run(x, y);
  EXPECT_TRUE(std::isinf(m.nmse) && m.nmse > 0);
  EXPECT_EQ(m.snr_db, -kSnrCapDb);
  EXPECT_DOUBLE_EQ(m.mean_cos, 0.75);  // rows 0, 2, 3 both zero (1), row 1 one zero (0)
  EXPECT_EQ(m.norm_ratio_mean, 1.0);   // row 1 left out of the ratio statistics
  EXPECT_TRUE(std::isinf(m.nmse_per_token[1]));
  EXPECT_EQ(m.nmse_per_token[0], 0.0);
  expect_no_nan(m);
  EXPECT_EQ(nlohmann::json(m)["nmse"], "inf");
  // Non-zero signal, zero reconstruction row: cos 0, ratio 0.
  x(2, 0) = 1.0f;
  m = run(x, y);
  EXPECT_EQ(m.zero_ref_rows, 3);
  EXPECT_NEAR(m.norm_ratio_p1, 0.02, 1e-12);  // ratios {0, 1, 1}, linear percentile
  EXPECT_DOUBLE_EQ(m.nmse, 5.0);              // (1 + 4) / 1
  expect_no_nan(m);
}

TEST(Metrics, MatchesIndependentDoubleComputation) {
  const int rows = 96, cols = 40;
  const Matrix x = random_kv(rows, cols, 4);
  Matrix y = add_noise(x, 0.3, 5);
  for (int r = 0; r < rows; r += 3) y.row(r) *= 0.8f + 0.01f * r;  // token-scale errors
  const ReconstructionMetrics m = run(x, y);
  double err = 0, ref = 0, mag = 0, dir = 0, cos_sum = 0, ratio_sum = 0, mx = 0;
  std::vector<double> abs_err, ch_err(cols), ch_ref(cols), ratios;
  for (int r = 0; r < rows; ++r) {
    double e = 0, a = 0, b = 0, d = 0;
    for (int c = 0; c < cols; ++c) {
      const double xa = x(r, c), xb = y(r, c), diff = xa - xb;
      e += diff * diff, a += xa * xa, b += xb * xb, d += xa * xb;
      ch_err[c] += diff * diff, ch_ref[c] += xa * xa;
      abs_err.push_back(std::fabs(diff));
      mx = std::max(mx, std::fabs(diff));
    }
    err += e, ref += a;
    const double cs = d / std::sqrt(a * b);
    cos_sum += cs;
    mag += std::pow(std::sqrt(a) - std::sqrt(b), 2);
    dir += 2 * std::sqrt(a) * std::sqrt(b) * (1 - cs);
    ratios.push_back(std::sqrt(b / a));
    ratio_sum += ratios.back();
    EXPECT_NEAR(m.nmse_per_token[r], e / a, 1e-12 * (e / a));
  }
  EXPECT_NEAR(m.nmse, err / ref, 1e-12 * err / ref);
  EXPECT_NEAR(m.mse, err / (rows * cols), 1e-12 * err);
  EXPECT_NEAR(m.snr_db, 10 * std::log10(ref / err), 1e-9);
  EXPECT_NEAR(m.max_abs, mx, 1e-6 * mx);
  EXPECT_NEAR(m.p99_abs, sorted_percentile(abs_err, 0.99), 1e-6 * mx);
  EXPECT_NEAR(m.p999_abs, sorted_percentile(abs_err, 0.999), 1e-6 * mx);
  EXPECT_NEAR(m.mean_cos, cos_sum / rows, 1e-12);
  EXPECT_NEAR(m.magnitude_err, mag, 1e-9 * err);
  EXPECT_NEAR(m.direction_err, dir, 1e-9 * err);
  EXPECT_NEAR(m.magnitude_err + m.direction_err, m.sum_sq_err, 1e-9 * err);
  EXPECT_NEAR(m.norm_ratio_mean, ratio_sum / rows, 1e-12);
  EXPECT_NEAR(m.norm_ratio_p1, sorted_percentile(ratios, 0.01), 1e-12);
  EXPECT_NEAR(m.norm_ratio_p99, sorted_percentile(ratios, 0.99), 1e-12);
  for (int c = 0; c < cols; ++c)
    EXPECT_NEAR(m.nmse_per_channel[c], ch_err[c] / ch_ref[c], 1e-12 * ch_err[c] / ch_ref[c]);
}

TEST(Metrics, RowMaskMeasuresOnlyMaskedRows) {
  const Matrix x = random_kv(50, 16, 6);
  const Matrix y = add_noise(x, 0.1, 7);
  std::vector<std::uint8_t> mask(50, 0);
  for (int r = 10; r < 30; ++r) mask[r] = 1;
  const ReconstructionMetrics a = run(x, y, mask.data());
  const Matrix xs = x.middleRows(10, 20), ys = y.middleRows(10, 20);
  const ReconstructionMetrics b = run(xs, ys);
  EXPECT_EQ(a.rows, 20);
  EXPECT_EQ(a.nmse, b.nmse);
  EXPECT_EQ(a.p99_abs, b.p99_abs);
  EXPECT_EQ(a.nmse_per_token, b.nmse_per_token);
  EXPECT_EQ(a.nmse_per_channel, b.nmse_per_channel);
  // Nothing selected: empty, zero error, no NaN.
  std::vector<std::uint8_t> none(50, 0);
  const ReconstructionMetrics c = run(x, y, none.data());
  EXPECT_EQ(c.rows, 0);
  EXPECT_EQ(c.nmse, 0.0);
  expect_no_nan(c);
}

TEST(Metrics, PercentilesMatchFullSort) {
  Rng rng(8);
  for (int n : {1, 2, 3, 10, 101, 1000, 4097}) {
    std::vector<double> v(n);
    for (auto& x : v) x = rng.normal();
    const std::vector<double> ps = {0.5, 0.99, 0.01, 0.999, 0.0, 1.0};
    std::vector<double> out(ps.size());
    std::vector<double> work = v;
    percentiles_inplace(std::span<double>(work), ps, out);
    for (std::size_t i = 0; i < ps.size(); ++i)
      EXPECT_DOUBLE_EQ(out[i], sorted_percentile(v, ps[i])) << "n=" << n << " p=" << ps[i];
  }
}

TEST(Metrics, TailPercentilesMatchFullSortOnAdversarialData) {
  // The tail-level path preselects values above a sampled threshold; it must stay exact for
  // sorted, reversed, constant and heavily tied inputs.
  Rng rng(9);
  const int n = 16384;
  std::vector<std::vector<double>> cases(5, std::vector<double>(n));
  for (int i = 0; i < n; ++i) {
    cases[0][i] = rng.normal();
    cases[1][i] = i;
    cases[2][i] = n - i;
    cases[3][i] = 1.5;
    cases[4][i] = static_cast<double>(static_cast<int>(rng.uniform() * 3));
  }
  for (int i = 0; i < n; i += 8) cases[0][i] = -10;  // the strided sample sees only small values
  const std::vector<double> ps = {0.999, 0.99};
  for (std::size_t c = 0; c < cases.size(); ++c) {
    std::vector<double> work = cases[c], out(2);
    percentiles_inplace(std::span<double>(work), ps, out);
    std::vector<float> workf(cases[c].begin(), cases[c].end());
    std::vector<double> outf(2);
    percentiles_inplace(std::span<float>(workf), ps, outf);
    for (std::size_t i = 0; i < ps.size(); ++i) {
      EXPECT_DOUBLE_EQ(out[i], sorted_percentile(cases[c], ps[i])) << "case " << c;
      EXPECT_NEAR(outf[i], sorted_percentile(cases[c], ps[i]), 1e-3) << "case " << c;
    }
  }
}

TEST(Metrics, SnrAndNmseConventions) {
  EXPECT_EQ(safe_nmse(0, 0), 0.0);
  EXPECT_TRUE(std::isinf(safe_nmse(1, 0)));
  EXPECT_EQ(snr_db_from_nmse(0), kSnrCapDb);
  EXPECT_EQ(snr_db_from_nmse(std::numeric_limits<double>::infinity()), -kSnrCapDb);
  EXPECT_NEAR(snr_db_from_nmse(1e-3), 30.0, 1e-12);
  EXPECT_EQ(json_number(std::numeric_limits<double>::quiet_NaN()), "nan");
  EXPECT_EQ(json_number(-std::numeric_limits<double>::infinity()), "-inf");
}

}  // namespace
}  // namespace kvarn
