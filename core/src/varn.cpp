#include "kvarn/core/varn.hpp"

#include <algorithm>

#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/reduce.hpp"
#include "kvarn/data/error.hpp"

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

void row_stds(const float* x, int rows, int cols, std::vector<float>& out) {
  for (int r = 0; r < rows; ++r) out[r] = canonical_std(x + static_cast<size_t>(r) * cols, cols);
}

// out[r][c] = (src[r][c] / by_col[c]) / by_row[r]   (the upstream T / exp(log_sc) / exp(log_sr))
void rescale(const float* src, int rows, int cols, const float* by_col, const float* by_row,
             float* out) {
  for (int r = 0; r < rows; ++r) {
    const float* s = src + static_cast<size_t>(r) * cols;
    float* o = out + static_cast<size_t>(r) * cols;
    const float rr = by_row[r];
    for (int c = 0; c < cols; ++c) o[c] = (s[c] / by_col[c]) / rr;
  }
}

// Transposed variant, same arithmetic per element: srcT is cols x rows, outT[c][r] =
// (srcT[c][r] / by_col[c]) / by_row[r].
void rescale_t(const float* src_t, int rows, int cols, const float* by_col, const float* by_row,
               float* out_t) {
  for (int c = 0; c < cols; ++c) {
    const float* s = src_t + static_cast<size_t>(c) * rows;
    float* o = out_t + static_cast<size_t>(c) * rows;
    const float cc = by_col[c];
    for (int r = 0; r < rows; ++r) o[r] = (s[r] / cc) / by_row[r];
  }
}

struct Workspace {
  std::vector<float> t_t, cur, cur_t;
  void resize(size_t n) {
    if (t_t.size() < n) {
      t_t.resize(n);
      cur.resize(n);
      cur_t.resize(n);
    }
  }
};

}  // namespace

float imbalance(const float* x, int rows, int cols, float floor) {
  std::vector<float> xt(static_cast<size_t>(rows) * cols), rs(rows), cs(cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) xt[static_cast<size_t>(c) * rows + r] = x[r * cols + c];
  row_stds(x, rows, cols, rs);
  row_stds(xt.data(), cols, rows, cs);
  return ratio(cs, floor) + ratio(rs, floor);
}

VarnResult variance_normalize(const float* tile, int rows, int cols, const VarnParams& p,
                              float* balanced) {
  KVARN_CHECK(rows >= 8 && cols >= 8 && rows % 8 == 0 && cols % 8 == 0,
              "variance_normalize: tile ", rows, "x", cols, " must have sides that are multiples of 8");
  KVARN_CHECK(p.iters >= 0, "variance_normalize: iterations must be >= 0, got ", p.iters);
  thread_local Workspace ws;
  const size_t n = static_cast<size_t>(rows) * cols;
  ws.resize(n);
  float* tt = ws.t_t.data();
  float* cur = ws.cur.data();
  float* cur_t = ws.cur_t.data();
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) tt[static_cast<size_t>(c) * rows + r] = tile[r * cols + c];

  VarnResult res;
  std::vector<float> log_sc(cols, 0.0f), log_sr(rows, 0.0f), sc(cols, 1.0f), sr(rows, 1.0f);
  std::vector<float> col_std(cols), row_std(rows);
  res.s_col.assign(cols, 1.0f);
  res.s_row.assign(rows, 1.0f);

  row_stds(tt, cols, rows, col_std);  // columns of T
  row_stds(tile, rows, cols, row_std);
  float best = ratio(col_std, p.imbalance_floor) + ratio(row_std, p.imbalance_floor);
  res.imbalance_before = best;

  for (int it = 1; it <= p.iters; ++it) {
    // col_std holds the column stds of the current cur (computed at the end of the last step).
    for (int c = 0; c < cols; ++c) {
      log_sc[c] = clampf(log_sc[c] + portable_log(clampf(col_std[c], p.std_min, p.std_max)),
                         p.log_min, p.log_max);
      sc[c] = portable_exp(log_sc[c]);
    }
    rescale(tile, rows, cols, sc.data(), sr.data(), cur);
    row_stds(cur, rows, cols, row_std);
    for (int r = 0; r < rows; ++r) {
      log_sr[r] = clampf(log_sr[r] + portable_log(clampf(row_std[r], p.std_min, p.std_max)),
                         p.log_min, p.log_max);
      sr[r] = portable_exp(log_sr[r]);
    }
    rescale(tile, rows, cols, sc.data(), sr.data(), cur);
    rescale_t(tt, rows, cols, sc.data(), sr.data(), cur_t);
    row_stds(cur, rows, cols, row_std);
    row_stds(cur_t, cols, rows, col_std);
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
  rescale(tile, rows, cols, res.s_col.data(), res.s_row.data(), balanced);
  return res;
}

}  // namespace kvarn
