#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "kvarn/core/pack.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/core/rtn.hpp"
#include "test_util.hpp"

namespace kvarn {
namespace {

TEST(Pack, ExhaustiveRoundTripEveryBitWidth) {
  for (int bits = 1; bits <= 8; ++bits) {
    const int levels = 1 << bits;
    for (int n : {1, 2, 3, 7, 8, 9, 64, 127, 128, 256}) {
      std::vector<std::uint8_t> codes(n), back(n);
      // every code value at every position class
      for (int shift = 0; shift < levels; ++shift) {
        for (int i = 0; i < n; ++i) codes[i] = static_cast<std::uint8_t>((i * 7 + shift) % levels);
        std::vector<std::uint8_t> packed(packed_bytes(n, bits), 0xAA);
        pack_codes(codes.data(), n, bits, packed.data());
        unpack_codes(packed.data(), n, bits, back.data());
        ASSERT_EQ(codes, back) << "bits " << bits << " n " << n;
      }
    }
  }
}

TEST(Pack, BitPositionsFollowUpstreamConvention) {
  // 4-bit: low nibble = even index.
  std::uint8_t c4[2] = {0x3, 0xC}, p4[1];
  pack_codes(c4, 2, 4, p4);
  EXPECT_EQ(p4[0], 0xC3);
  // 2-bit: index c at shift 2*(c%4).
  std::uint8_t c2[4] = {1, 2, 3, 0}, p2[1];
  pack_codes(c2, 4, 2, p2);
  EXPECT_EQ(p2[0], 0b00111001);
  // 3-bit: PACK = 2 values per byte at shifts 0 and 3.
  std::uint8_t c3[3] = {5, 6, 7}, p3[2];
  pack_codes(c3, 3, 3, p3);
  EXPECT_EQ(p3[0], 5 | (6 << 3));
  EXPECT_EQ(p3[1], 7);
  EXPECT_EQ(packed_bytes(128, 3), 64u);
  EXPECT_EQ(packed_bytes(128, 5), 128u);
  EXPECT_EQ(packed_bytes(128, 1), 16u);
}

TEST(Rtn, ErrorAtMostHalfAScaleAndCodesInRange) {
  for (int bits = 1; bits <= 8; ++bits) {
    Matrix x = testing::random_kv(16, 128, 100 + bits);
    std::vector<std::uint8_t> codes(x.size());
    std::vector<float> scale(16), lo(16);
    RtnParams p;
    p.bits = bits;
    rtn_rows(x.data(), 16, 128, p, codes.data(), scale.data(), lo.data());
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 128; ++c) {
        const int q = codes[r * 128 + c];
        ASSERT_LT(q, 1 << bits);
        const float xh = q * scale[r] + lo[r];
        ASSERT_LE(std::fabs(xh - x(r, c)), 0.5f * scale[r] * (1 + 1e-5f) + 1e-6f)
            << "bits " << bits;
      }
  }
}

// rtn_rows' range is std::min / std::max folded over the row in order (the upstream's
// torch.amin / amax; rows are finite, rtn_rows' contract); the vectorized fold must give the same
// bits, including which signed zero is the extreme.
TEST(Rtn, RangeIsTheSequentialFoldBitForBit) {
  auto fold = [](const std::vector<float>& row) {
    float mn = row[0], mx = row[0];
    for (float v : row) {
      mn = std::min(mn, v);
      mx = std::max(mx, v);
    }
    return std::pair{mn, mx};
  };
  Rng rng(11);
  std::vector<std::vector<float>> rows;
  for (int cols : {8, 12, 16, 128}) {
    std::vector<float> r(cols);
    for (auto& v : r) v = static_cast<float>(rng.normal());
    rows.push_back(r);
    // Both zeros at the minimum, in either order. At indices 5 (lane 5) and 9 (lane 1) the first
    // zero sits in a higher lane than the second, so folding the lanes in lane order would pick
    // the other sign.
    const int i0 = cols >= 16 ? 5 : 1, i1 = cols >= 16 ? 9 : 6;
    std::vector<float> z(cols, 1.0f);
    z[i0] = -0.0f;
    z[i1] = 0.0f;
    rows.push_back(z);
    std::swap(z[i0], z[i1]);
    rows.push_back(z);
    std::vector<float> m(cols, -1.0f);  // zeros at the maximum
    m[cols - 1] = 0.0f;
    m[5] = -0.0f;
    rows.push_back(m);
    rows.push_back(std::vector<float>(cols, -0.0f));
  }
  RtnParams p;
  p.bits = 4;
  for (const auto& row : rows) {
    const int cols = static_cast<int>(row.size());
    std::vector<std::uint8_t> codes(cols);
    float s, lo;
    rtn_rows(row.data(), 1, cols, p, codes.data(), &s, &lo);
    const auto [mn, mx] = fold(row);
    EXPECT_EQ(float_bits(lo), float_bits(mn)) << "cols " << cols << " first " << row[0];
    EXPECT_EQ(float_bits(s), float_bits(std::max((mx - mn) / 15.0f, p.min_scale)))
        << "cols " << cols;
  }
}

TEST(Rtn, RoundsHalfToEvenAndGuardsZeroRange) {
  // Row [0, 1, 2, 3] at 1 bit: scale 3, (x-0)/3 = 0.333, 0.667 -> 0, 1; 1.5/3 = 0.5 -> 0 (even).
  float row[8] = {0, 1.5f, 3, 3, 3, 3, 3, 3};
  std::uint8_t codes[8];
  float s, lo;
  RtnParams p;
  p.bits = 1;
  rtn_rows(row, 1, 8, p, codes, &s, &lo);
  EXPECT_EQ(codes[1], 0);
  float flat[8] = {2, 2, 2, 2, 2, 2, 2, 2};
  rtn_rows(flat, 1, 8, p, codes, &s, &lo);
  EXPECT_EQ(s, 1e-10f);
  for (auto q : codes) EXPECT_EQ(q, 0);
}

TEST(Rtn, QuantileRangeClipsOutliers) {
  std::vector<float> row(100);
  for (int i = 0; i < 100; ++i) row[i] = static_cast<float>(i);
  row[99] = 1e4f;
  EXPECT_FLOAT_EQ(quantile_linear(row.data(), 100, 0.5f), 49.5f);
  std::vector<std::uint8_t> codes(100);
  float s, lo;
  RtnParams p;
  p.bits = 4;
  p.quantile = 0.01f;
  rtn_rows(row.data(), 1, 100, p, codes.data(), &s, &lo);
  EXPECT_FLOAT_EQ(lo, 0.99f);
  EXPECT_LT(s, 1000.0f / 15.0f);
  EXPECT_EQ(codes[99], 15);
}

}  // namespace
}  // namespace kvarn
