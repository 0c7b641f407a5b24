// Asymmetric round-to-nearest per row with a float zero-point (KIVI / KVarN flavour):
//   lo = min(row) (or the q-quantile), hi = max(row) (or the 1-q quantile)
//   scale = max((hi - lo) / (2^b - 1), 1e-10);  code = clamp(round_half_even((x - lo) / scale))
#ifndef KVARN_CORE_RTN_HPP_
#define KVARN_CORE_RTN_HPP_

#include <cstdint>

namespace kvarn {

struct RtnParams {
  int bits = 4;
  float quantile = 0.0f;  // 0: min/max; q in (0, 0.5): torch.quantile(row, [q, 1-q]) (linear)
  float min_scale = 1e-10f;
};

// x: rows x cols row-major. codes: rows x cols. scale, lo: [rows].
void rtn_rows(const float* x, int rows, int cols, const RtnParams& p, std::uint8_t* codes,
              float* scale, float* lo);

// Linear-interpolation quantile of n values (torch.quantile default), q in [0, 1].
float quantile_linear(const float* x, int n, float q);

}  // namespace kvarn

#endif  // KVARN_CORE_RTN_HPP_
