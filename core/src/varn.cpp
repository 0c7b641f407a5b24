#include "kvarn/core/varn.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kvarn/core/cpu.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/reduce.hpp"
#include "kvarn/data/error.hpp"
#include "simd.hpp"
#include "varn_kernels.hpp"

namespace kvarn {
namespace {

inline float clampf(float x, float lo, float hi) { return std::min(std::max(x, lo), hi); }

float ratio(const std::vector<float>& s, float floor) {
  float mx = s[0], mn = s[0];
  for (float v : s) {
    mx = std::max(mx, v);
    mn = std::min(mn, v);
  }
  return mx / std::max(mn, floor);
}

KVARN_SIMD_CLONES void row_stds(const float* x, int rows, int cols, std::vector<float>& out) {
  for (int r = 0; r < rows; ++r) out[r] = canonical_std(x + static_cast<size_t>(r) * cols, cols);
}

// Column stds in the canonical order of each column (lane = row % 8, rows in order, fixed tree),
// vectorized across columns with eight accumulator rows: no transpose needed.
KVARN_SIMD_CLONES void col_stds(const float* x, int rows, int cols, std::vector<float>& out) {
  thread_local std::vector<float> acc, mean;
  acc.assign(static_cast<size_t>(8) * cols, 0.0f);
  mean.resize(cols);
  for (int r = 0; r < rows; ++r) {
    float* a = acc.data() + static_cast<size_t>(r & 7) * cols;
    const float* xr = x + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) a[c] += xr[c];
  }
  float p[8];
  for (int c = 0; c < cols; ++c) {
    for (int j = 0; j < 8; ++j) p[j] = acc[static_cast<size_t>(j) * cols + c];
    mean[c] = combine8(p) / static_cast<float>(rows);
  }
  std::fill(acc.begin(), acc.end(), 0.0f);
  for (int r = 0; r < rows; ++r) {
    float* a = acc.data() + static_cast<size_t>(r & 7) * cols;
    const float* xr = x + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) {
      const float d = xr[c] - mean[c];
      a[c] += d * d;
    }
  }
  for (int c = 0; c < cols; ++c) {
    for (int j = 0; j < 8; ++j) p[j] = acc[static_cast<size_t>(j) * cols + c];
    out[c] = sqrt_rn(combine8(p) / static_cast<float>(rows - 1));
  }
}

// log_s = clamp(log_s + log(clamp(std)), log_min, log_max); s = exp(log_s), for every scale of
// one axis. The scales are independent, so the portable log/exp vectorize across them.
KVARN_SIMD_CLONES void update_log_scales(const std::vector<float>& stds, const VarnParams& p,
                                         std::vector<float>& log_s, std::vector<float>& s) {
  // Locals and restrict pointers: the stores cannot alias the parameters, so the loop vectorizes.
  const float std_min = p.std_min, std_max = p.std_max, log_min = p.log_min, log_max = p.log_max;
  const float* __restrict sd = stds.data();
  float* __restrict ls = log_s.data();
  float* __restrict sc = s.data();
  const size_t n = stds.size();
  for (size_t i = 0; i < n; ++i) {
    const float l = clampf(ls[i] + portable_log(clampf(sd[i], std_min, std_max)), log_min, log_max);
    ls[i] = l;
    sc[i] = portable_exp(l);
  }
}

}  // namespace

// Each dividend is T, T / s_col or T / s_col / s_row with scales exp(l), l clamped to [log_min,
// log_max] (or 1 before the first update): bounds on the scales bound them all, a factor 2 covering
// the roundings on the way. Markstein's sequence needs every dividend and divisor in [2^-60, 2^60].
VarnDivisionBounds varn_division_bounds(const VarnParams& p) {
  constexpr double kLo = 0x1p-60, kHi = 0x1p60;
  const double s_lo = std::min(1.0, std::exp(static_cast<double>(p.log_min))) / 2;
  const double s_hi = std::max(1.0, std::exp(static_cast<double>(p.log_max))) * 2;
  if (!(s_lo >= kLo && s_hi <= kHi)) return {1.0, 0.0};  // empty: never
  return {kLo * (s_hi * s_hi), kHi * (s_lo * s_lo)};
}

namespace {

// Whether every division of variance_normalize on this tile may take the FMA build's divider-free
// path (varn_kernels.inc): no -0, Inf or NaN in T and its nonzero magnitudes within
// varn_division_bounds.
KVARN_SIMD_CLONES bool fast_division(const float* tile, std::size_t n, const VarnParams& p) {
  // Magnitudes compared as bits (monotonic for non-negative floats), eight lanes at a time (n is
  // a multiple of 8).
  typedef std::uint32_t v8u __attribute__((vector_size(32)));
  const v8u all = ~v8u{};
  v8u lo8 = all, hi8 = {}, neg8 = {};
  for (std::size_t i = 0; i < n; i += 8) {
    v8u u;
    std::memcpy(&u, tile + i, sizeof u);
    const v8u m = u & 0x7fffffffu, nz = m == 0u ? all : m;
    hi8 = hi8 > m ? hi8 : m;
    lo8 = lo8 < nz ? lo8 : nz;
    neg8 |= u == 0x80000000u ? all : v8u{};
  }
  std::uint32_t lo = lo8[0], hi = hi8[0], neg_zero = neg8[0];
  for (int j = 1; j < 8; ++j) {
    lo = std::min(lo, lo8[j]);
    hi = std::max(hi, hi8[j]);
    neg_zero |= neg8[j];
  }
  if (neg_zero != 0 || hi >= 0x7f800000u) return false;  // -0, Inf or NaN
  if (hi == 0) return true;                              // all +0: the sequence returns +0
  const VarnDivisionBounds b = varn_division_bounds(p);
  return bits_float(lo) >= b.lo && bits_float(hi) <= b.hi;
}

const VarnKernels& select_kernels(VarnBuild build) {
  static const bool fma = varn_fma_available();
  switch (build) {
    case VarnBuild::kBaseline:
      return varn_baseline::kernels();
    case VarnBuild::kFma:
      KVARN_CHECK(fma, "variance_normalize: the AVX2 + FMA build is not available on this CPU");
      return varn_fma::kernels();
    default:
      return fma ? varn_fma::kernels() : varn_baseline::kernels();
  }
}

}  // namespace

bool varn_fma_available() { return varn_fma::built() && cpu_has_avx2_fma(); }

float imbalance(const float* x, int rows, int cols, float floor) {
  std::vector<float> rs(rows), cs(cols);
  row_stds(x, rows, cols, rs);
  col_stds(x, rows, cols, cs);
  return ratio(cs, floor) + ratio(rs, floor);
}

VarnResult variance_normalize(const float* tile, int rows, int cols, const VarnParams& p,
                              float* balanced, VarnBuild build) {
  KVARN_CHECK(rows >= 8 && cols >= 8 && rows % 8 == 0 && cols % 8 == 0, "variance_normalize: tile ",
              rows, "x", cols, " must have sides that are multiples of 8");
  KVARN_CHECK(p.iters >= 0, "variance_normalize: iterations must be >= 0, got ", p.iters);
  const auto at = [](const float* x) { return reinterpret_cast<std::uintptr_t>(x); };
  const std::uintptr_t bytes = sizeof(float) * static_cast<std::uintptr_t>(rows) * cols;
  KVARN_CHECK(at(balanced) + bytes <= at(tile) || at(tile) + bytes <= at(balanced),
              "variance_normalize: the output must not overlap the tile");
  const VarnKernels& k = select_kernels(build);
  thread_local std::vector<float> a_buf;
  const size_t n = static_cast<size_t>(rows) * cols;
  if (a_buf.size() < n) a_buf.resize(n);
  float* a = a_buf.data();
  // cur = T / sc / sr of the current step lives in `balanced`: when the last step is the best,
  // it is already the result (the same divisions as divide_cols_rows, in the same order).
  float* cur = balanced;

  VarnResult res;
  std::vector<float> log_sc(cols, 0.0f), log_sr(rows, 0.0f), sc(cols, 1.0f), sr(rows, 1.0f);
  std::vector<float> col_std(cols), row_std(rows);
  res.s_col.assign(cols, 1.0f);
  res.s_row.assign(rows, 1.0f);

  std::vector<float> ones(rows, 1.0f);
  const bool fast = &k != &varn_baseline::kernels() && fast_division(tile, n, p);
  // x / 1 == x
  k.divide_and_stats(tile, rows, cols, ones.data(), cur, row_std.data(), col_std.data(), fast);
  float best = ratio(col_std, p.imbalance_floor) + ratio(row_std, p.imbalance_floor);
  res.imbalance_before = best;

  for (int it = 1; it <= p.iters; ++it) {
    // col_std holds the column stds of the current cur (computed at the end of the last step).
    update_log_scales(col_std, p, log_sc, sc);
    // Row stds of tile / sc / sr with the previous sr (the upstream's sequential update).
    k.divide_cols_and_row_stds(tile, rows, cols, sc.data(), sr.data(), a, row_std.data(), fast);
    update_log_scales(row_std, p, log_sr, sr);
    k.divide_and_stats(a, rows, cols, sr.data(), cur, row_std.data(), col_std.data(), fast);
    float imb = ratio(col_std, p.imbalance_floor) + ratio(row_std, p.imbalance_floor);
    res.trace.push_back(imb);
    if (imb <= best) {
      best = imb;
      res.s_col = sc;
      res.s_row = sr;
      res.best_iter = it;
    }
  }
  res.imbalance_after = best;
  if (res.best_iter == 0 || res.best_iter != p.iters)
    k.divide_cols_rows(tile, rows, cols, res.s_col.data(), res.s_row.data(), balanced, fast);
  return res;
}

}  // namespace kvarn
