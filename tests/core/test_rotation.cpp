#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "kvarn/core/hadamard_fp16.hpp"
#include "kvarn/core/half_array.hpp"
#include "kvarn/core/kvarn.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/quarot.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/core/rotation.hpp"
#include "test_util.hpp"

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

// ---- the published fp16 rotation (KVarN default) ----

// fp16 values over the whole range: normals of many magnitudes, subnormals, zeros of both signs.
std::vector<float> wide_fp16(Rng& rng, std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double mag = std::exp2(-26.0 + 40.0 * rng.uniform());  // 2^-26 .. 2^14
    float v = round_to_half(static_cast<float>(rng.normal() * mag));
    if (i % 97 == 5) v = -0.0f;
    x[i] = v;
  }
  return x;
}

// Exact check that h is the correctly rounded (RNE) fp16 of q = num * 2^-62 (num exact):
// compares with the fp16 neighbours in 128-bit integers.
void expect_correctly_rounded(std::uint16_t h, __int128 num, const std::string& where) {
  auto scaled = [](std::uint16_t b) -> __int128 {  // fp16 value * 2^62, exact
    return static_cast<__int128>(half_to_fixed24(b)) << 38;
  };
  const bool neg = num < 0;
  const __int128 a = neg ? -num : num;
  const std::uint16_t mag = h & 0x7fff;
  ASSERT_LT(mag, 0x7c00) << where << ": overflow";
  if (a != 0) {
    ASSERT_EQ((h & 0x8000) != 0, neg) << where;
  }
  const __int128 v = scaled(mag);
  const __int128 up = mag + 1 < 0x7c00 ? scaled(static_cast<std::uint16_t>(mag + 1))
                                       : (static_cast<__int128>(65536) << 62);
  const __int128 down = mag > 0 ? scaled(static_cast<std::uint16_t>(mag - 1)) : -scaled(1);
  // |a - v| <= half a step on either side; ties go to the even mantissa.
  ASSERT_LE(2 * (a - v), up - v) << where;
  ASSERT_LE(2 * (v - a), v - down) << where;
  if (2 * (a - v) == up - v || 2 * (v - a) == v - down) {
    ASSERT_EQ(mag & 1, 0) << where;  // a tie: the even neighbour
  }
}

class Fp16RotationDims : public ::testing::TestWithParam<int> {};

TEST_P(Fp16RotationDims, ScaleIsTheFp16OfOneOverSqrtD) {
  const int d = GetParam();
  const float c = half_bits_to_float(hadamard_fp16_scale_bits(d));
  EXPECT_EQ(c, round_to_half(static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))));
  const std::map<int, float> known = {
      {128, 0.08837890625f}, {512, 0.044189453125f}, {64, 0.125f}, {256, 0.0625f}};
  if (known.count(d)) {
    EXPECT_EQ(c, known.at(d));
  }
  // The matrix is +-c Sylvester, symmetric.
  const Rotation rot(RotationKind::kHadamardFp16, d);
  const std::vector<float> m = rot.matrix();
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j)
      ASSERT_EQ(m[i * d + j], (__builtin_popcount(i & j) & 1) ? -c : c) << i << "," << j;
}

TEST_P(Fp16RotationDims, ForwardIsTheCorrectlyRoundedExactProduct) {
  const int d = GetParam(), rows = 37;
  Rng rng(100 + d);
  std::vector<float> x = wide_fp16(rng, static_cast<std::size_t>(rows) * d);
  // A row of fp16 values at the top of the range whose rotation stays finite.
  for (int j = 0; j < d; ++j) x[j] = (j % 3 == 0 ? 1.0f : -1.0f) * 4096.0f * (j % 7 + 1) / 8.0f;
  const Rotation rot(RotationKind::kHadamardFp16, d);
  std::vector<float> y = x, cols(x.size()), z = x;
  rot.forward_fp16(y.data(), rows);
  // forward() (fp32, round-to-odd) rounds to the same fp16; forward_columns agrees with it.
  rot.forward(z.data(), rows);
  transpose(x.data(), rows, d, cols.data());
  rot.forward_columns(cols.data(), rows);
  const Fp16Scale c = fp16_scale(hadamard_fp16_scale_bits(d));
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < d; ++i) {
      // Independent exact value: dense +-1 sum in 128-bit integers (units of 2^-24), times m_c.
      __int128 s = 0;
      for (int j = 0; j < d; ++j) {
        const __int128 xj = half_to_fixed24(float_to_half_bits(x[r * d + j]));
        s += (__builtin_popcount(i & j) & 1) ? -xj : xj;
      }
      const __int128 num = (s * c.m) << (62 - 24 + c.e);  // value * 2^62
      const std::size_t k = static_cast<std::size_t>(r) * d + i;
      const std::string where =
          "D=" + std::to_string(d) + " row " + std::to_string(r) + " ch " + std::to_string(i);
      expect_correctly_rounded(float_to_half_bits(y[k]), num, where);
      ASSERT_EQ(float_to_half_bits(z[k]), float_to_half_bits(y[k])) << where;
      ASSERT_EQ(float_bits(cols[static_cast<std::size_t>(i) * rows + r]), float_bits(z[k]))
          << where;
    }
}

// forward_columns_fp16 rounds the exact product to fp16 in one pass; it must give the bits of the
// two-step path (round to odd in fp32, then to fp16), signed zeros and fp16 subnormals included.
TEST_P(Fp16RotationDims, ColumnsToFp16InOnePassMatchTheTwoStepPath) {
  const int d = GetParam(), n = 40;
  Rng rng(300 + d);
  const Rotation rot(RotationKind::kHadamardFp16, d);
  for (int round = 0; round < 6; ++round) {
    std::vector<float> x = wide_fp16(rng, static_cast<std::size_t>(d) * n);
    if (round % 2 == 1) {  // tiny columns: results in the fp16 subnormal range and zeros
      for (std::size_t i = 0; i < x.size(); ++i)
        x[i] = round_to_half(static_cast<float>(rng.normal()) * 0x1p-20f * (i % 5));
    }
    std::vector<float> one = x, two = x;
    rot.forward_columns_fp16(one.data(), n);
    rot.forward_columns(two.data(), n);
    round_to_half_inplace(two.data(), two.size());
    for (std::size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(float_bits(one[i]), float_bits(two[i]))
          << "D=" << d << " round " << round << " at " << i;
  }
}

TEST_P(Fp16RotationDims, InverseIsTheSameFp16MatrixInFp32) {
  const int d = GetParam(), rows = 70;
  Rng rng(7 + d);
  std::vector<float> x(static_cast<std::size_t>(rows) * d);
  for (auto& v : x) v = static_cast<float>(rng.normal());
  const Rotation rot(RotationKind::kHadamardFp16, d);
  const float c = half_bits_to_float(hadamard_fp16_scale_bits(d));
  std::vector<float> y = x;
  rot.inverse(y.data(), rows);
  for (int r = 0; r < rows; ++r) {
    std::vector<float> want(x.begin() + r * d, x.begin() + (r + 1) * d);
    fwht(want.data(), d);
    for (int i = 0; i < d; ++i)
      ASSERT_EQ(float_bits(y[r * d + i]), float_bits(want[i] * c)) << r << "," << i;
  }
  // Not orthogonal: inverse(forward(x)) = c^2 D x up to fp32 rounding (c^2 D = 0.999786 at 128,
  // 512).
  std::vector<float> z = x;
  for (auto& v : z) v = round_to_half(v);
  std::vector<float> w = z;
  rot.forward(w.data(), rows);
  rot.inverse(w.data(), rows);
  const double g = static_cast<double>(c) * c * d;
  for (std::size_t i = 0; i < z.size(); ++i)
    ASSERT_NEAR(w[i], g * z[i], 1e-5 + 1e-5 * std::fabs(z[i]));
}

INSTANTIATE_TEST_SUITE_P(PowerOfTwo, Fp16RotationDims, ::testing::Values(8, 64, 128, 256, 512));

TEST(Rotation, Fp16RotationOfOtherDimsIsTheKroneckerMatrixWithFp16Entries) {
  for (int d : {96, 192}) {
    const Rotation rot(RotationKind::kHadamardFp16, d), ref(RotationKind::kHadamard, d);
    const float c = half_bits_to_float(hadamard_fp16_scale_bits(d));
    const std::vector<float> m = rot.matrix(), e = ref.matrix();
    const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    for (std::size_t i = 0; i < m.size(); ++i)
      ASSERT_EQ(m[i], e[i] > 0 ? c : -c) << d << " " << i << " " << e[i] / s;
  }
}

TEST(Rotation, KvarnRotationNames) {
  EXPECT_EQ(parse_kvarn_rotation("hadamard"), RotationKind::kHadamardFp16);
  EXPECT_EQ(parse_kvarn_rotation("hadamard_exact"), RotationKind::kHadamard);
  EXPECT_EQ(parse_kvarn_rotation("none"), RotationKind::kNone);
  EXPECT_EQ(parse_kvarn_rotation("haar"), RotationKind::kHaar);
  for (auto k : {RotationKind::kHadamardFp16, RotationKind::kHadamard, RotationKind::kNone,
                 RotationKind::kHaar})
    EXPECT_EQ(parse_kvarn_rotation(kvarn_rotation_name(k)), k);
  EXPECT_THROW(parse_kvarn_rotation("hadamard_fp16"), std::exception);
  // QuaRot keeps its own names: "hadamard" is its exact-scale fp32 rotation.
  EXPECT_EQ(parse_rotation("hadamard"), RotationKind::kHadamard);
  EXPECT_THROW(parse_rotation("hadamard_exact"), std::exception);
  // The KVarN default is the published arithmetic; the spec names it "hadamard".
  EXPECT_EQ(KvarnConfig().rotation, RotationKind::kHadamardFp16);
  EXPECT_NE(make_method("kvarn:rotation=hadamard_exact")->spec().find("rotation=hadamard_exact"),
            std::string::npos);
  EXPECT_EQ(make_method("kvarn:k=4,v=2,g=128,rotation=hadamard")->name(), "kvarn_k4v2_g128");
}

// The row path (blocks of rows run channel-major) is bit-identical to the scalar row FWHT.
TEST(Rotation, BlockedRowPathsMatchTheScalarFwht) {
  for (int d : {64, 128, 256}) {
    const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    for (int rows : {1, 7, 64, 65, 200}) {
      Rng rng(d * 1000 + rows);
      std::vector<float> x(static_cast<std::size_t>(rows) * d);
      for (auto& v : x) v = static_cast<float>(rng.normal() * 3.0);
      std::vector<float> want = x;
      for (int r = 0; r < rows; ++r) {
        fwht(want.data() + static_cast<std::size_t>(r) * d, d);
        for (int i = 0; i < d; ++i) want[static_cast<std::size_t>(r) * d + i] *= s;
      }
      const Rotation rot(RotationKind::kHadamard, d);
      std::vector<float> f = x, b = x;
      rot.forward(f.data(), rows);
      rot.inverse(b.data(), rows);
      for (std::size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(float_bits(f[i]), float_bits(want[i])) << d << " " << rows << " " << i;
        ASSERT_EQ(float_bits(b[i]), float_bits(want[i])) << d << " " << rows << " " << i;
      }
    }
  }
}

// inverse_columns on a channel-major block and fp16_round_trip (the kept rows' reconstruction)
// give inverse()'s and forward_fp16() + inverse()'s bits, for every kind, Kronecker dims included.
TEST(Rotation, ColumnInverseAndFp16RoundTripMatchTheRowPaths) {
  const std::vector<std::pair<RotationKind, int>> cases = {
      {RotationKind::kHadamard, 128},    {RotationKind::kHadamardFp16, 128},
      {RotationKind::kHadamardFp16, 96}, {RotationKind::kHadamard, 80},
      {RotationKind::kHaar, 64},         {RotationKind::kNone, 64}};
  for (const auto& [kind, d] : cases) {
    for (int rows : {1, 63, 64, 129}) {
      const Matrix x = testing::random_kv(rows, d, 17 * d + rows);
      const Rotation rot(kind, d, 5);
      Matrix want = x;
      rot.inverse(want.data(), rows);
      std::vector<float> cols(static_cast<std::size_t>(rows) * d), got(cols.size());
      transpose(x.data(), rows, d, cols.data());
      rot.inverse_columns(cols.data(), rows);
      transpose(cols.data(), d, rows, got.data());
      Matrix kept = x;
      rot.forward_fp16(kept.data(), rows);
      rot.inverse(kept.data(), rows);
      std::vector<float> trip(got.size(), -1.0f);
      rot.fp16_round_trip(x.data(), rows, trip.data());
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(float_bits(got[i]), float_bits(want.data()[i]))
            << to_string(kind) << d << " " << i;
        ASSERT_EQ(float_bits(trip[i]), float_bits(kept.data()[i]))
            << to_string(kind) << d << " " << i;
      }
    }
  }
}

// ---- values at the fp16 limit: one clear error, never a silent NaN ----

Matrix limit_tile(int tokens, int d) {
  Matrix m(tokens, d);
  for (int t = 0; t < tokens; ++t)
    for (int c = 0; c < d; ++c) m(t, c) = 65504.0f;
  m(3, 5) = -65504.0f;
  return m;
}

TEST(Fp16Range, RotatedOverflowIsAnErrorNamingRowAndChannel) {
  const int d = 128;
  for (auto kind : {RotationKind::kHadamardFp16, RotationKind::kHadamard}) {
    const Rotation rot(kind, d);
    Matrix x = testing::random_kv(10, d, 3);
    x.row(6).setConstant(65504.0f);
    try {
      rot.forward_fp16(x.data(), 10, 40);
      FAIL() << "expected an error";
    } catch (const std::exception& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("row (token) 46, channel 0"), std::string::npos) << msg;
      EXPECT_NE(msg.find("fp16 range"), std::string::npos) << msg;
    }
  }
  // No rotation: values at the limit are representable and pass unchanged.
  Matrix x = limit_tile(4, d);
  Rotation(RotationKind::kNone, d).forward_fp16(x.data(), 4);
  EXPECT_EQ(x(0, 0), 65504.0f);
}

TEST(Fp16Range, KvarnAndQuarotRejectLimitTilesInsteadOfNan) {
  const int d = 128, tokens = 300;
  const Matrix k = limit_tile(tokens, d), v = limit_tile(tokens, d);
  for (const char* spec : {"kvarn_k4v2_g128", "kvarn_k4v4_g64", "kvarn:rotation=hadamard_exact",
                           "kvarn:rotation=haar,seed=1", "quarot_k4v4",
                           "quarot:k_bits=4,v_bits=4,rotation=haar,seed=2"}) {
    try {
      quantize_sequence(*make_method(spec), k, v);
      FAIL() << spec << ": expected an error";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("beyond the fp16 range"), std::string::npos)
          << spec << ": " << e.what();
    }
  }
  // Without rotation the same tiles quantize to finite reconstructions.
  for (const char* spec : {"kvarn:rotation=none", "quarot:k_bits=4,v_bits=4,rotation=none"}) {
    const SequenceResult r = quantize_sequence(*make_method(spec), k, v);
    EXPECT_TRUE(r.k_hat.allFinite() && r.v_hat.allFinite()) << spec;
  }
  // Inside the range (|c * S| <= 2^15) the default quantizes to finite values.
  Matrix ok = testing::random_kv(tokens, d, 9, true, 1.0f);
  ok *= 32768.0f / (ok.cwiseAbs().maxCoeff() * std::sqrt(static_cast<float>(d)));
  for (Eigen::Index i = 0; i < ok.size(); ++i) ok.data()[i] = round_to_half(ok.data()[i]);
  const SequenceResult r = quantize_sequence(*make_method("kvarn_k4v2_g128"), ok, ok);
  EXPECT_TRUE(r.k_hat.allFinite() && r.v_hat.allFinite());
}

}  // namespace
}  // namespace kvarn
