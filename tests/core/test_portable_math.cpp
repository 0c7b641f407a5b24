#include "kvarn/core/portable_math.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "kvarn/core/half_array.hpp"
#include "kvarn/core/reduce.hpp"
#include "kvarn/core/rng.hpp"

namespace kvarn {
namespace {

TEST(PortableMath, LogMatchesLibmWithinOneUlp) {
  Rng rng(1);
  for (int i = 0; i < 200000; ++i) {
    float x = static_cast<float>(std::exp(rng.uniform() * 40.0 - 20.0));
    float ours = portable_log(x);
    float ref = static_cast<float>(std::log(static_cast<double>(x)));
    ASSERT_LE(std::fabs(ours - ref), std::fabs(ref) * 1.2e-7f + 1e-38f) << x;
  }
  EXPECT_EQ(portable_log(1.0f), 0.0f);
  EXPECT_NEAR(portable_log(1e-3f), std::log(1e-3), 1e-6);
  EXPECT_NEAR(portable_log(1e3f), std::log(1e3), 1e-5);
}

TEST(PortableMath, ExpMatchesLibmWithinOneUlp) {
  Rng rng(2);
  for (int i = 0; i < 200000; ++i) {
    float x = static_cast<float>(rng.uniform() * 24.0 - 12.0);
    float ours = portable_exp(x);
    float ref = static_cast<float>(std::exp(static_cast<double>(x)));
    ASSERT_LE(std::fabs(ours - ref), ref * 1.2e-7f) << x;
  }
  EXPECT_EQ(portable_exp(0.0f), 1.0f);
}

// Bits of portable_log / portable_exp pinned at the edges of their bit manipulation (float
// subnormals, the sqrt(2) split of the mantissa, both ends of the exponent range): the CUDA store
// computes the same functions, and the golden records depend on every bit.
TEST(PortableMath, LogAndExpBitsArePinned) {
  const std::pair<float, std::uint32_t> logs[] = {
      {0x1p-149f, 0xc2ce8ed0u},        {0x1.8p-140f, 0xc2c14531u},      {0x1p-126f, 0xc2aeac50u},
      {0x1.6a09e6p-1f, 0xbeb17219u},   {0x1.6a09e6p+0f, 0x3eb17217u},   {0x1.6a09e8p+0f, 0x3eb1721au},
      {0x1.6a09e4p+0f, 0x3eb17215u},   {0x1.6a09e6p-100f, 0xc289efb1u}, {0x1.6a09e8p+100f, 0x428b5295u},
      {0x1p+0f, 0x00000000u},          {0x1p+1f, 0x3f317218u},          {0x1p-1f, 0xbf317218u},
      {0x1.8p+1f, 0x3f8c9f54u},        {0x1.fffffep+127f, 0x42b17218u}, {0x1.0624dep-10f, 0xc0dd0c55u},
      {0x1.dp+2f, 0x3ffd9175u}};
  for (const auto& [x, bits] : logs) EXPECT_EQ(float_bits(portable_log(x)), bits) << x;
  const std::pair<float, std::uint32_t> exps[] = {
      {-0x1.4p+6f, 0x05bfecbau},      {0x1.4p+6f, 0x792abbceu},      {-0x1.cp+2f, 0x3a6f0b5du},
      {0x1.4p+3f, 0x46ac14eeu},       {0x0p+0f, 0x3f800000u},        {-0x0p+0f, 0x3f800000u},
      {0x1.62e43p-2f, 0x3fb504f3u},   {-0x1.62e43p-2f, 0x3f3504f3u}, {0x1.62e43p-1f, 0x40000000u},
      {0x1p+0f, 0x402df854u},         {-0x1p+0f, 0x3ebc5ab2u},       {0x1.b7cdfep-34f, 0x3f800000u},
      {0x1.6p+2f, 0x4374b122u}};
  for (const auto& [x, bits] : exps) EXPECT_EQ(float_bits(portable_exp(x)), bits) << x;
}

// The vectorized in-place rounding equals round_to_half element by element, on every magnitude:
// fp16 normals, the fp16 subnormal range (ties included), zeros, overflow, Inf and NaN.
TEST(PortableMath, RoundToHalfInplaceMatchesScalar) {
  Rng rng(4);
  std::vector<float> x;
  for (int i = 0; i < 20000; ++i) {
    const double mag = std::exp2(rng.uniform() * 60.0 - 40.0);  // 2^-40 .. 2^20
    x.push_back(static_cast<float>(rng.uniform() < 0.5 ? -mag : mag));
  }
  for (int k = 0; k < 2048; ++k) {  // every fp16 subnormal step and the midpoints between them
    x.push_back(static_cast<float>(k) * 0x1p-25f);
    x.push_back(-static_cast<float>(k) * 0x1p-25f);
  }
  for (float v : {0.0f, -0.0f, 0x1p-14f, 0x1.ffcp-15f, 0x1.ffep-15f, 0x1p-25f, 0x1.000002p-25f,
                  0x1p-149f, 65504.0f, 65519.0f, 65520.0f, -70000.0f,
                  std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    x.push_back(v);
  std::vector<float> y = x;
  round_to_half_inplace(y.data(), y.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float ref = round_to_half(x[i]);
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(y[i])) << x[i];
    } else {
      EXPECT_EQ(float_bits(y[i]), float_bits(ref)) << x[i];
    }
  }
}

TEST(HalfArray, TransposeMovesEveryElementBitForBit) {
  // Block (8 x 8 multiples, the vectorized path) and general shapes; NaN payloads and signed
  // zeros must arrive unchanged.
  const std::pair<int, int> shapes[] = {{8, 8},  {128, 128}, {64, 128}, {128, 24}, {16, 256},
                                        {3, 5},  {12, 8},    {8, 20},   {1, 1}};
  Rng rng(7);
  for (auto [rows, cols] : shapes) {
    std::vector<float> x(static_cast<std::size_t>(rows) * cols), t(x.size(), -1.0f);
    for (auto& v : x) v = static_cast<float>(rng.normal());
    x[0] = -0.0f;
    if (x.size() > 2) x[x.size() / 2] = bits_float(0x7fc01234u);
    transpose(x.data(), rows, cols, t.data());
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        ASSERT_EQ(float_bits(t[static_cast<std::size_t>(c) * rows + r]),
                  float_bits(x[static_cast<std::size_t>(r) * cols + c]))
            << rows << "x" << cols << " at " << r << "," << c;
  }
}

TEST(PortableMath, HalfConversionExhaustiveRoundTrip) {
  // Every finite half converts to float and back to itself.
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    std::uint16_t bits = static_cast<std::uint16_t>(h);
    if ((bits & 0x7c00u) == 0x7c00u) continue;  // Inf/NaN
    float f = half_bits_to_float(bits);
    ASSERT_EQ(float_to_half_bits(f), bits) << std::hex << h;
  }
}

TEST(PortableMath, HalfRoundsToNearestEven) {
  // 1 + 2^-11 is the midpoint between 1 and the next half: ties to even (1.0).
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(1.0f + 0x1.0p-11f)), 1.0f);
  // 1 + 3*2^-11 is the midpoint between 1+2^-10 (odd) and 1+2^-9 (even).
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(1.0f + 3 * 0x1.0p-11f)), 1.0f + 0x1.0p-9f);
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(half_bits_to_float(float_to_half_bits(65520.0f))));
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(65519.0f)), 65504.0f);
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(0x1.0p-24f)), 0x1.0p-24f);  // smallest subnormal
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(0x1.0p-25f)), 0.0f);        // tie -> even (0)
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(0x1.8p-25f)), 0x1.0p-24f);
}

TEST(PortableMath, Fp8ExhaustiveRoundTripAndSaturation) {
  for (Fp8Format fmt : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    for (int b = 0; b < 256; ++b) {
      float f = fp8_bits_to_float(static_cast<std::uint8_t>(b), fmt);
      if (!std::isfinite(f)) continue;
      std::uint8_t back = float_to_fp8_bits(f, fmt);
      if (f == 0.0f) {
        ASSERT_EQ(fp8_bits_to_float(back, fmt), 0.0f);
        continue;
      }
      ASSERT_EQ(back, b) << "format " << static_cast<int>(fmt) << " code " << b;
    }
  }
  EXPECT_EQ(fp8_bits_to_float(float_to_fp8_bits(1e6f, Fp8Format::kE4M3), Fp8Format::kE4M3), 448.0f);
  EXPECT_EQ(fp8_bits_to_float(float_to_fp8_bits(-1e9f, Fp8Format::kE5M2), Fp8Format::kE5M2),
            -57344.0f);
  // e4m3 around 1: spacing 1/8; 1 + 1/16 ties to even (1.0), 1 + 3/16 to 1.25.
  EXPECT_EQ(fp8_bits_to_float(float_to_fp8_bits(1.0625f, Fp8Format::kE4M3), Fp8Format::kE4M3), 1.0f);
  EXPECT_EQ(fp8_bits_to_float(float_to_fp8_bits(1.1875f, Fp8Format::kE4M3), Fp8Format::kE4M3), 1.25f);
  // smallest e4m3 subnormal 2^-9
  EXPECT_EQ(fp8_bits_to_float(float_to_fp8_bits(0x1.0p-9f, Fp8Format::kE4M3), Fp8Format::kE4M3),
            0x1.0p-9f);
}

TEST(PortableMath, RoundHalfEven) {
  EXPECT_EQ(round_half_even(0.5f), 0.0f);
  EXPECT_EQ(round_half_even(1.5f), 2.0f);
  EXPECT_EQ(round_half_even(2.5f), 2.0f);
  EXPECT_EQ(round_half_even(-0.5f), -0.0f);
  EXPECT_EQ(round_half_even(2.4999998f), 2.0f);
}

TEST(CanonicalReduce, StdMatchesDoublePrecision) {
  Rng rng(3);
  std::vector<float> x(128);
  for (auto& v : x) v = static_cast<float>(100.0 + rng.normal());
  double mean = 0;
  for (float v : x) mean += v;
  mean /= 128;
  double var = 0;
  for (float v : x) var += (v - mean) * (v - mean);
  double sd = std::sqrt(var / 127);
  EXPECT_NEAR(canonical_std(x.data(), 128), sd, sd * 1e-4);
  // The order is fixed: permuting within a lane class changes nothing, and the result is
  // deterministic across calls.
  EXPECT_EQ(canonical_sum(x.data(), 128), canonical_sum(x.data(), 128));
}

}  // namespace
}  // namespace kvarn
