// Log-domain Sinkhorn-style variance normalization of one tile (KVarN "VarN"), as upstream:
//
//   log_sc = 0[C]; log_sr = 0[R]; cur = T; best = Imb(T) with scales 1 (identity may win)
//   repeat iters: col_std = std(cur over rows) clamp [std_min, std_max]
//                 log_sc = clamp(log_sc + log(col_std), log_min, log_max); cur = T / sc / sr
//                 row_std = std(cur over cols) clamp ...; log_sr = clamp(...);  cur = T / sc / sr
//                 if Imb(cur) <= best: keep (sc, sr)
//   Imb(X) = max(col_std)/max(min(col_std), floor) + max(row_std)/max(min(row_std), floor)
//
// Statistics use the canonical reductions (reduce.hpp), log/exp the portable ones, so the CUDA
// store kernel reproduces every bit.
#ifndef KVARN_CORE_VARN_HPP_
#define KVARN_CORE_VARN_HPP_

#include <vector>

namespace kvarn {

struct VarnParams {
  int iters = 8;
  float std_min = 1e-3f;
  float std_max = 1e3f;
  float log_min = -0.3f;
  float log_max = 10.0f;
  float imbalance_floor = 1e-8f;
};

struct VarnResult {
  std::vector<float> s_row;    // [rows] chosen row scales, exp(log_sr*)
  std::vector<float> s_col;    // [cols] chosen column scales, exp(log_sc*)
  float imbalance_before = 0;  // Imb(T)
  float imbalance_after = 0;   // Imb(T / s_col / s_row), the best seen
  int best_iter = 0;           // 0: identity kept
  std::vector<float> trace;    // Imb after each iteration
};

// Which build of the element-wise passes runs. kAuto: the AVX2 + FMA build (divisions by the
// scales without the divider) where the CPU has both, else the baseline. Every build returns the
// same bits; tests compare them.
enum class VarnBuild { kAuto, kBaseline, kFma };
bool varn_fma_available();

// tile: rows x cols row-major, finite. balanced (rows x cols, not overlapping tile) receives
// T / s_col / s_row.
VarnResult variance_normalize(const float* tile, int rows, int cols, const VarnParams& params,
                              float* balanced, VarnBuild build = VarnBuild::kAuto);

// Where a division of variance_normalize by a scale may be done without the divider: with y =
// RN(1/b), q0 = RN(a y) and two fused corrections q = q + (a - b q) y, Markstein's theorem gives
// the correctly rounded a / b when every dividend and divisor lies in [2^-60, 2^60]. That holds
// for a tile with no -0, Inf or NaN whose nonzero magnitudes lie in [lo, hi] (lo > hi: never, the
// scale range alone rules it out). The FMA build and the CUDA store kernel both use it.
struct VarnDivisionBounds {
  double lo, hi;
};
VarnDivisionBounds varn_division_bounds(const VarnParams& params);
// Imb of a matrix (rows x cols, row-major), canonical reductions.
float imbalance(const float* x, int rows, int cols, float floor = 1e-8f);

}  // namespace kvarn

#endif  // KVARN_CORE_VARN_HPP_
