#include "kvarn/core/rtn.hpp"

#include <algorithm>
#include <vector>

#include "kvarn/core/portable_math.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn {

float quantile_linear(const float* x, int n, float q) {
  std::vector<float> s(x, x + n);
  std::sort(s.begin(), s.end());
  double pos = static_cast<double>(q) * (n - 1);
  int i = static_cast<int>(pos);
  if (i >= n - 1) return s[n - 1];
  float frac = static_cast<float>(pos - i);
  return s[i] + (s[i + 1] - s[i]) * frac;
}

void rtn_rows(const float* x, int rows, int cols, const RtnParams& p, std::uint8_t* codes,
              float* scale, float* lo) {
  KVARN_CHECK(p.bits >= 1 && p.bits <= 8, "RTN bits must be in 1..8, got ", p.bits);
  KVARN_CHECK(p.quantile >= 0.0f && p.quantile < 0.5f, "RTN quantile must be in [0, 0.5), got ",
              p.quantile);
  const float qmax = static_cast<float>((1 << p.bits) - 1);
  for (int r = 0; r < rows; ++r) {
    const float* row = x + static_cast<size_t>(r) * cols;
    float mn, mx;
    if (p.quantile > 0.0f) {
      mn = quantile_linear(row, cols, p.quantile);
      mx = quantile_linear(row, cols, 1.0f - p.quantile);
    } else {
      mn = row[0];
      mx = row[0];
      for (int c = 1; c < cols; ++c) {
        mn = std::min(mn, row[c]);
        mx = std::max(mx, row[c]);
      }
    }
    const float s = std::max((mx - mn) / qmax, p.min_scale);
    scale[r] = s;
    lo[r] = mn;
    std::uint8_t* out = codes + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) {
      float q = round_half_even((row[c] - mn) / s);
      q = std::min(std::max(q, 0.0f), qmax);
      out[c] = static_cast<std::uint8_t>(q);
    }
  }
}

}  // namespace kvarn
