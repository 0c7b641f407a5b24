#include "kvarn/core/varn.hpp"

#include <algorithm>

#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/reduce.hpp"
#include "kvarn/data/error.hpp"
#include "simd.hpp"

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

// a = src / by_col (column-wise; the first division of the upstream T / exp(log_sc) /
// exp(log_sr)) and, in the same pass, the canonical stds of the rows of a / by_row (lane c % 8,
// fixed tree; as canonical_std). a / by_row itself is not needed later, so each of its rows lives
// only in a row buffer.
KVARN_SIMD_CLONES void divide_cols_and_row_stds(const float* src, int rows, int cols,
                                                const float* by_col, const float* by_row, float* a,
                                                std::vector<float>& row_std) {
  thread_local std::vector<float> row;
  row.resize(cols);
  float* cr = row.data();
  for (int r = 0; r < rows; ++r) {
    const float* s = src + static_cast<size_t>(r) * cols;
    float* ar = a + static_cast<size_t>(r) * cols;
    const float rr = by_row[r];
    float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int c = 0; c < cols; c += 8) {
      for (int j = 0; j < 8; ++j) {
        const float av = s[c + j] / by_col[c + j];
        ar[c + j] = av;
        const float v = av / rr;
        cr[c + j] = v;
        p[j] += v;
      }
    }
    const float m = combine8(p) / static_cast<float>(cols);
    float q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int c = 0; c < cols; c += 8) {
      for (int j = 0; j < 8; ++j) {
        const float d = cr[c + j] - m;
        q[j] += d * d;
      }
    }
    row_std[r] = sqrt_rn(combine8(q) / static_cast<float>(cols - 1));
  }
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

// cur = a / by_row (row-wise) and, in the same two passes, the canonical stds of cur's rows (and
// of its columns when WITH_COLS). Row order: lane c % 8 along the row; column order: lane r % 8
// down the column (eight accumulator rows, vectorized across columns). Same values as
// canonical_std on each row/column.
template <bool WITH_COLS>
KVARN_SIMD_CLONES void divide_and_stats(const float* a, int rows, int cols, const float* by_row,
                                        float* cur, std::vector<float>& row_std,
                                        std::vector<float>& col_std) {
  thread_local std::vector<float> acc, row_mean, col_mean;
  row_mean.resize(rows);
  if (WITH_COLS) {
    acc.assign(static_cast<size_t>(8) * cols, 0.0f);
    col_mean.resize(cols);
  }
  for (int r = 0; r < rows; ++r) {
    const float* ar = a + static_cast<size_t>(r) * cols;
    float* cr = cur + static_cast<size_t>(r) * cols;
    float* accr = WITH_COLS ? acc.data() + static_cast<size_t>(r & 7) * cols : nullptr;
    const float rr = by_row[r];
    float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int c = 0; c < cols; c += 8) {
      for (int j = 0; j < 8; ++j) {
        const float v = ar[c + j] / rr;
        cr[c + j] = v;
        p[j] += v;
        if (WITH_COLS) accr[c + j] += v;
      }
    }
    row_mean[r] = combine8(p) / static_cast<float>(cols);
  }
  float q[8];
  if (WITH_COLS) {
    for (int c = 0; c < cols; ++c) {
      for (int j = 0; j < 8; ++j) q[j] = acc[static_cast<size_t>(j) * cols + c];
      col_mean[c] = combine8(q) / static_cast<float>(rows);
    }
    std::fill(acc.begin(), acc.end(), 0.0f);
  }
  for (int r = 0; r < rows; ++r) {
    const float* cr = cur + static_cast<size_t>(r) * cols;
    float* accr = WITH_COLS ? acc.data() + static_cast<size_t>(r & 7) * cols : nullptr;
    const float m = row_mean[r];
    float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int c = 0; c < cols; c += 8) {
      for (int j = 0; j < 8; ++j) {
        const float d = cr[c + j] - m;
        p[j] += d * d;
        if (WITH_COLS) {
          const float e = cr[c + j] - col_mean[c + j];
          accr[c + j] += e * e;
        }
      }
    }
    row_std[r] = sqrt_rn(combine8(p) / static_cast<float>(cols - 1));
  }
  if (WITH_COLS) {
    for (int c = 0; c < cols; ++c) {
      for (int j = 0; j < 8; ++j) q[j] = acc[static_cast<size_t>(j) * cols + c];
      col_std[c] = sqrt_rn(combine8(q) / static_cast<float>(rows - 1));
    }
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

// out[r][c] = (src[r][c] / by_col[c]) / by_row[r]: the final balanced tile in one pass.
KVARN_SIMD_CLONES void divide_cols_rows(const float* src, int rows, int cols, const float* by_col,
                                        const float* by_row, float* out) {
  for (int r = 0; r < rows; ++r) {
    const float* s = src + static_cast<size_t>(r) * cols;
    float* o = out + static_cast<size_t>(r) * cols;
    const float rr = by_row[r];
    for (int c = 0; c < cols; ++c) o[c] = (s[c] / by_col[c]) / rr;
  }
}

struct Workspace {
  std::vector<float> a, cur;
  void resize(size_t n) {
    if (a.size() < n) {
      a.resize(n);
      cur.resize(n);
    }
  }
};

}  // namespace

float imbalance(const float* x, int rows, int cols, float floor) {
  std::vector<float> rs(rows), cs(cols);
  row_stds(x, rows, cols, rs);
  col_stds(x, rows, cols, cs);
  return ratio(cs, floor) + ratio(rs, floor);
}

VarnResult variance_normalize(const float* tile, int rows, int cols, const VarnParams& p,
                              float* balanced) {
  KVARN_CHECK(rows >= 8 && cols >= 8 && rows % 8 == 0 && cols % 8 == 0, "variance_normalize: tile ",
              rows, "x", cols, " must have sides that are multiples of 8");
  KVARN_CHECK(p.iters >= 0, "variance_normalize: iterations must be >= 0, got ", p.iters);
  thread_local Workspace ws;
  const size_t n = static_cast<size_t>(rows) * cols;
  ws.resize(n);
  float* a = ws.a.data();
  float* cur = ws.cur.data();

  VarnResult res;
  std::vector<float> log_sc(cols, 0.0f), log_sr(rows, 0.0f), sc(cols, 1.0f), sr(rows, 1.0f);
  std::vector<float> col_std(cols), row_std(rows);
  res.s_col.assign(cols, 1.0f);
  res.s_row.assign(rows, 1.0f);

  std::vector<float> ones(rows, 1.0f);
  divide_and_stats<true>(tile, rows, cols, ones.data(), cur, row_std, col_std);  // x / 1 == x
  float best = ratio(col_std, p.imbalance_floor) + ratio(row_std, p.imbalance_floor);
  res.imbalance_before = best;

  for (int it = 1; it <= p.iters; ++it) {
    // col_std holds the column stds of the current cur (computed at the end of the last step).
    update_log_scales(col_std, p, log_sc, sc);
    // Row stds of tile / sc / sr with the previous sr (the upstream's sequential update).
    divide_cols_and_row_stds(tile, rows, cols, sc.data(), sr.data(), a, row_std);
    update_log_scales(row_std, p, log_sr, sr);
    divide_and_stats<true>(a, rows, cols, sr.data(), cur, row_std, col_std);
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
  divide_cols_rows(tile, rows, cols, res.s_col.data(), res.s_row.data(), balanced);
  return res;
}

}  // namespace kvarn
