#include "kvarn/core/rtn.hpp"

#include <algorithm>
#include <vector>

#include "kvarn/core/portable_math.hpp"
#include "kvarn/data/error.hpp"
#include "simd.hpp"

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

namespace {

void row_min_max_sequential(const float* row, int cols, float& mn, float& mx) {
  mn = row[0];
  mx = row[0];
  for (int c = 1; c < cols; ++c) {
    mn = std::min(mn, row[c]);
    mx = std::max(mx, row[c]);
  }
}

// std::min / std::max folded over the (finite) row in order. Eight lanes seeded with row[0]
// vectorize and give the same values, since equal nonzero floats have equal bits; only the sign of
// a zero extreme depends on which zero came first, so a zero result is decided by the sequential
// loop.
inline void row_min_max(const float* row, int cols, float& mn, float& mx) {
  if (cols % 8 != 0) return row_min_max_sequential(row, cols, mn, mx);
  float lo[8], hi[8];
  for (int j = 0; j < 8; ++j) lo[j] = hi[j] = row[0];
  for (int c = 0; c < cols; c += 8) {
    for (int j = 0; j < 8; ++j) {
      lo[j] = row[c + j] < lo[j] ? row[c + j] : lo[j];
      hi[j] = hi[j] < row[c + j] ? row[c + j] : hi[j];
    }
  }
  mn = lo[0];
  mx = hi[0];
  for (int j = 1; j < 8; ++j) {
    mn = std::min(mn, lo[j]);
    mx = std::max(mx, hi[j]);
  }
  if (mn == 0.0f || mx == 0.0f) row_min_max_sequential(row, cols, mn, mx);
}

}  // namespace

KVARN_SIMD_CLONES void rtn_rows(const float* x, int rows, int cols, const RtnParams& p,
                                std::uint8_t* codes, float* scale, float* lo) {
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
      row_min_max(row, cols, mn, mx);
    }
    const float s = std::max((mx - mn) / qmax, p.min_scale);
    scale[r] = s;
    lo[r] = mn;
    // clamp(round(y)) == round(clamp(y)) for y = (x - lo) / scale, and after the clamp y is in
    // [0, 255], where round_half_even is exact and branch-free: the loop vectorizes.
    std::uint8_t* out = codes + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) {
      float y = (row[c] - mn) / s;
      y = std::min(std::max(y, 0.0f), qmax);
      out[c] = static_cast<std::uint8_t>(static_cast<int>((y + 12582912.0f) - 12582912.0f));
    }
  }
}

}  // namespace kvarn
