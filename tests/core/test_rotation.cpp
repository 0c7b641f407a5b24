#include "kvarn/core/rotation.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "kvarn/core/rng.hpp"

namespace kvarn {
namespace {

double max_orthogonality_error(const std::vector<float>& m, int d) {
  double worst = 0;
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) {
      double s = 0;
      for (int k = 0; k < d; ++k) s += static_cast<double>(m[i * d + k]) * m[j * d + k];
      worst = std::max(worst, std::fabs(s - (i == j ? 1.0 : 0.0)));
    }
  return worst;
}

class RotationDims : public ::testing::TestWithParam<int> {};

TEST_P(RotationDims, HadamardIsOrthonormalAndSelfInverse) {
  const int d = GetParam();
  Rotation rot(RotationKind::kHadamard, d);
  std::vector<float> m = rot.matrix();
  EXPECT_LT(max_orthogonality_error(m, d), 1e-6) << "D=" << d;
  Rng rng(d);
  std::vector<float> x(4 * d), y;
  for (auto& v : x) v = static_cast<float>(rng.normal());
  y = x;
  rot.forward(y.data(), 4);
  rot.inverse(y.data(), 4);
  for (int i = 0; i < 4 * d; ++i) ASSERT_NEAR(y[i], x[i], 1e-5) << i;
  if (is_pow2(d)) {
    // Sylvester H/sqrt(D) is symmetric, so forward == inverse.
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j) ASSERT_EQ(m[i * d + j], m[j * d + i]);
    // Entry formula H[i][j] = (-1)^popcount(i&j) / sqrt(D).
    const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j)
        ASSERT_FLOAT_EQ(m[i * d + j], (__builtin_popcount(i & j) & 1) ? -s : s);
  }
}

TEST_P(RotationDims, HaarIsOrthonormalAndSeeded) {
  const int d = GetParam();
  Rotation a(RotationKind::kHaar, d, 7), b(RotationKind::kHaar, d, 7), c(RotationKind::kHaar, d, 8);
  EXPECT_LT(max_orthogonality_error(a.matrix(), d), 1e-5);
  EXPECT_EQ(a.matrix(), b.matrix());
  EXPECT_NE(a.matrix(), c.matrix());
}

INSTANTIATE_TEST_SUITE_P(SupportedHeadDims, RotationDims,
                         ::testing::Values(64, 80, 96, 112, 128, 192, 256));

TEST(Rotation, SmallHadamardMatricesAreHadamard) {
  for (int n : {12, 20, 28, 24, 40, 56}) {
    std::vector<float> h = hadamard_matrix(n);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        double s = 0;
        for (int k = 0; k < n; ++k) s += h[i * n + k] * h[j * n + k];
        ASSERT_EQ(s, i == j ? n : 0) << "order " << n;
      }
  }
}

TEST(Rotation, UnsupportedDimIsAClearError) {
  try {
    Rotation r(RotationKind::kHadamard, 72);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("72"), std::string::npos);
  }
  EXPECT_THROW(parse_rotation("hadamart"), std::exception);
}

TEST(Rotation, FwhtMatchesDenseSylvester) {
  const int n = 16;
  std::vector<float> x(n);
  Rng rng(5);
  for (auto& v : x) v = static_cast<float>(rng.normal());
  std::vector<float> y = x;
  fwht(y.data(), n);
  for (int j = 0; j < n; ++j) {
    double s = 0;
    for (int i = 0; i < n; ++i) s += ((__builtin_popcount(i & j) & 1) ? -1.0 : 1.0) * x[i];
    EXPECT_NEAR(y[j], s, 1e-5);
  }
}

}  // namespace
}  // namespace kvarn
