// Helpers shared by all test areas: deterministic random tiles that look like real KV
// (per-channel offsets/outliers for keys, a heavy first token), never all zeros.
#ifndef KVARN_TESTS_TEST_UTIL_HPP_
#define KVARN_TESTS_TEST_UTIL_HPP_

#include <vector>

#include "kvarn/core/method.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/rng.hpp"

namespace kvarn::testing {

// [rows, cols] fp16-representable Gaussian values with per-column offsets (key-like when
// `outliers`), scaled by `scale`.
inline Matrix random_kv(int rows, int cols, std::uint64_t seed, bool outliers = true,
                        float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> offset(cols, 0.0f), spread(cols, 1.0f);
  if (outliers) {
    for (int c = 0; c < cols; ++c) {
      offset[c] = static_cast<float>(rng.normal() * 0.5);
      spread[c] = static_cast<float>(0.5 + rng.uniform());
    }
    for (int c = 0; c < cols; c += 17) offset[c] = 8.0f + static_cast<float>(c % 5);  // outlier channels
  }
  Matrix m(rows, cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      float x = static_cast<float>(offset[c] + spread[c] * rng.normal()) * scale;
      if (outliers && r == 0) x *= 4.0f;  // attention-sink-like first token
      m(r, c) = round_to_half(x);
    }
  return m;
}

// [rows, cols] i.i.d. N(0, sigma^2) values (not fp16-rounded).
inline Matrix random_matrix(std::uint64_t seed, int rows, int cols, double sigma = 1.0) {
  Rng rng(seed);
  Matrix m(rows, cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) m(r, c) = static_cast<float>(sigma * rng.normal());
  return m;
}

// Element i of a little-endian f16 field.
inline float half_at(const Field& f, std::size_t i) {
  return half_bits_to_float(static_cast<std::uint16_t>(f.bytes[2 * i] | (f.bytes[2 * i + 1] << 8)));
}

// x plus Gaussian noise of standard deviation sigma (float).
inline Matrix add_noise(const Matrix& x, double sigma, std::uint64_t seed) {
  Rng rng(seed);
  Matrix y = x;
  for (Eigen::Index i = 0; i < y.size(); ++i)
    y.data()[i] = static_cast<float>(y.data()[i] + sigma * rng.normal());
  return y;
}

inline double nmse(const Matrix& x, const Matrix& y) {
  double num = 0, den = 0;
  for (int i = 0; i < x.size(); ++i) {
    double d = static_cast<double>(x.data()[i]) - y.data()[i];
    num += d * d;
    den += static_cast<double>(x.data()[i]) * x.data()[i];
  }
  return den > 0 ? num / den : num;
}

}  // namespace kvarn::testing

#endif  // KVARN_TESTS_TEST_UTIL_HPP_
