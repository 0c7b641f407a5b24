#include "kvarn/core/portable_math.hpp"

#include <gtest/gtest.h>

#include <cmath>

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
