#include "kvarn/eval/metrics.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>

#include "kvarn/data/error.hpp"

namespace kvarn {
namespace {

// Order statistics of w, where w holds the largest w.size() of n_total values (offset =
// n_total - w.size() smaller ones left out, all below every needed level).
template <typename T>
void order_stats(std::span<T> w, std::size_t n_total, std::span<const double> ps,
                 std::span<double> out) {
  const std::size_t offset = n_total - w.size();
  // Highest level first: each selection then only needs the prefix left by the previous one.
  std::vector<std::size_t> order(ps.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return ps[a] > ps[b]; });
  // end: the selection range [0, end) of w; next: the order statistic at index end (end < size).
  std::size_t end = w.size();
  double next = 0;
  for (std::size_t i : order) {
    const double pos = std::clamp(ps[i], 0.0, 1.0) * static_cast<double>(n_total - 1);
    const std::size_t lo_abs = static_cast<std::size_t>(std::floor(pos));
    const double frac = pos - static_cast<double>(lo_abs);
    const std::size_t lo = std::min(lo_abs - offset, end - 1);
    std::nth_element(w.begin(), w.begin() + lo, w.begin() + end);
    const double x = w[lo];
    // Every element after lo in [0, end) is >= w[lo]; the next order statistic is their min.
    double hi = x;
    if (lo + 1 < end) {
      hi = *std::min_element(w.begin() + lo + 1, w.begin() + end);
    } else if (lo + 1 < w.size()) {
      hi = next;
    }
    out[i] = x + frac * (hi - x);
    end = lo + 1;
    next = hi;
  }
}

template <typename T>
void percentiles_impl(std::span<T> v, std::span<const double> ps, std::span<double> out) {
  KVARN_CHECK(ps.size() == out.size(), "percentiles: ", ps.size(), " levels but ", out.size(),
              " outputs");
  const std::size_t n = v.size();
  if (n == 0) {
    std::fill(out.begin(), out.end(), 0.0);
    return;
  }
  const double p_min =
      ps.empty() ? 1.0 : std::clamp(*std::min_element(ps.begin(), ps.end()), 0.0, 1.0);
  const std::size_t need =
      n - static_cast<std::size_t>(std::floor(p_min * static_cast<double>(n - 1)));
  // Tail levels (p99, p99.9): a strided sample gives a threshold below the needed tail; only the
  // values above it are selected (exact whenever at least `need` values pass, else a full pass).
  constexpr std::size_t kStride = 8;
  if (n >= 2048 && need * 16 <= n) {
    thread_local std::vector<T> sample, cand;
    sample.clear();
    for (std::size_t i = 0; i < n; i += kStride) sample.push_back(v[i]);
    const double keep = std::min(1.0, 4.0 * static_cast<double>(need) / static_cast<double>(n));
    const std::size_t at =
        static_cast<std::size_t>(std::floor((1.0 - keep) * static_cast<double>(sample.size() - 1)));
    std::nth_element(sample.begin(), sample.begin() + at, sample.end());
    const T thr = sample[at];
    cand.clear();
    for (std::size_t i = 0; i < n; ++i)
      if (v[i] >= thr) cand.push_back(v[i]);
    if (cand.size() >= need) {
      order_stats(std::span<T>(cand), n, ps, out);
      return;
    }
  }
  order_stats(v, n, ps, out);
}

struct Scratch {
  std::vector<float> abs_err;
  std::vector<double> row_err, row_mag, row_dir, ratios, ch_err, ch_ref;
  std::vector<int> row_index;
};

}  // namespace

double safe_nmse(double err, double ref) {
  if (ref > 0) return err / ref;
  return err > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

double snr_db_from_nmse(double nmse) {
  if (!(nmse > 0)) return kSnrCapDb;
  if (std::isinf(nmse)) return -kSnrCapDb;
  return std::clamp(-10.0 * std::log10(nmse), -kSnrCapDb, kSnrCapDb);
}

void percentiles_inplace(std::span<float> values, std::span<const double> ps,
                         std::span<double> out) {
  percentiles_impl(values, ps, out);
}
void percentiles_inplace(std::span<double> values, std::span<const double> ps,
                         std::span<double> out) {
  percentiles_impl(values, ps, out);
}

namespace {

// The per-row pass: sums, cosines, the magnitude / direction split, |error| per element and the
// per-row and per-channel sums the later statistics read. Returns (sum of cosines, min cosine,
// max |error|).
std::array<double, 3> accumulate_rows(const float* x, const float* xh, int rows, std::size_t nc,
                                      const MetricOptions& opts, const std::uint8_t* row_mask,
                                      Scratch& s, ReconstructionMetrics& m) {
  float* abs_out = s.abs_err.data();
  double sum_cos = 0, min_cos = 1, max_abs = 0;
  double* ch_err = s.ch_err.data();
  double* ch_ref = s.ch_ref.data();
  for (int r = 0; r < rows; ++r) {
    if (row_mask && !row_mask[r]) continue;
    const float* a = x + static_cast<std::size_t>(r) * nc;
    const float* b = xh + static_cast<std::size_t>(r) * nc;
    double err = 0, ref = 0, hat = 0, dot = 0;
    float row_max = 0;
    for (std::size_t c = 0; c < nc; ++c) {
      const double xa = a[c], xb = b[c];
      const double e = xa - xb;
      err += e * e;
      ref += xa * xa;
      hat += xb * xb;
      dot += xa * xb;
      ch_err[c] += e * e;
      ch_ref[c] += xa * xa;
      const float ae = std::fabs(a[c] - b[c]);
      abs_out[c] = ae;
      row_max = std::max(row_max, ae);
    }
    abs_out += nc;
    max_abs = std::max(max_abs, static_cast<double>(row_max));
    const double nx = std::sqrt(ref), nh = std::sqrt(hat);
    double cos_t;
    if (ref == 0 && hat == 0) {
      cos_t = 1;
    } else if (ref == 0 || hat == 0) {
      cos_t = 0;
    } else {
      cos_t = std::clamp(dot / (nx * nh), -1.0, 1.0);
    }
    // Direction part 2(‖x‖‖x̂‖ − <x, x̂>) computed directly (no cancellation against err).
    const double mag = (nx - nh) * (nx - nh);
    const double dir = std::max(0.0, 2.0 * (nx * nh - (ref == 0 || hat == 0 ? 0.0 : dot)));
    sum_cos += cos_t;
    min_cos = std::min(min_cos, cos_t);
    m.sum_sq_err += err;
    m.sum_sq_ref += ref;
    m.sum_sq_hat += hat;
    m.magnitude_err += mag;
    m.direction_err += dir;
    s.row_err.push_back(err);
    s.row_mag.push_back(mag);
    s.row_dir.push_back(dir);
    if (ref > 0) {
      s.ratios.push_back(nh / nx);
    } else {
      ++m.zero_ref_rows;
      if (hat == 0) s.ratios.push_back(1.0);
    }
    if (opts.breakdown) m.nmse_per_token.push_back(safe_nmse(err, ref));
  }
  return {sum_cos, min_cos, max_abs};
}

// Share of magnitude error within the rows of largest error: select the largest group once, order
// it, and read prefixes.
void top_row_shares(Scratch& s, std::size_t nr, ReconstructionMetrics& m) {
  std::size_t counts[kTopRowFractions.size()];
  std::size_t most = 0;
  for (std::size_t i = 0; i < kTopRowFractions.size(); ++i) {
    counts[i] = std::max<std::size_t>(
        1, static_cast<std::size_t>(std::ceil(kTopRowFractions[i] * static_cast<double>(nr))));
    counts[i] = std::min(counts[i], nr);
    most = std::max(most, counts[i]);
  }
  s.row_index.resize(nr);
  std::iota(s.row_index.begin(), s.row_index.end(), 0);
  auto larger = [&](int a, int b) {
    return s.row_err[a] != s.row_err[b] ? s.row_err[a] > s.row_err[b] : a < b;
  };
  std::nth_element(s.row_index.begin(), s.row_index.begin() + (most - 1), s.row_index.end(),
                   larger);
  std::sort(s.row_index.begin(), s.row_index.begin() + most, larger);
  for (std::size_t i = 0; i < kTopRowFractions.size(); ++i) {
    double mag = 0, tot = 0;
    for (std::size_t j = 0; j < counts[i]; ++j) {
      const int r = s.row_index[j];
      mag += s.row_mag[r];
      tot += s.row_mag[r] + s.row_dir[r];
    }
    m.top_magnitude_share[i] = tot > 0 ? mag / tot : 0.0;
  }
}

// Mean and 1st / 99th percentiles of the row norm ratios ||x_hat|| / ||x||.
void norm_ratio_stats(Scratch& s, ReconstructionMetrics& m) {
  if (s.ratios.empty()) return;
  m.norm_ratio_mean =
      std::accumulate(s.ratios.begin(), s.ratios.end(), 0.0) / static_cast<double>(s.ratios.size());
  static constexpr double kLevels[] = {0.01, 0.99};
  double out[2];
  percentiles_inplace(std::span<double>(s.ratios), kLevels, out);
  m.norm_ratio_p1 = out[0];
  m.norm_ratio_p99 = out[1];
}

}  // namespace

ReconstructionMetrics reconstruction_metrics(const float* x, const float* xh, int rows, int cols,
                                             const MetricOptions& opts,
                                             const std::uint8_t* row_mask) {
  KVARN_CHECK(rows >= 0 && cols >= 0, "reconstruction_metrics: bad shape ", rows, "x", cols);
  thread_local Scratch s;
  ReconstructionMetrics m;
  m.cols = cols;
  const std::size_t nc = static_cast<std::size_t>(cols);
  s.abs_err.resize(static_cast<std::size_t>(rows) * nc);
  s.row_err.clear();
  s.row_mag.clear();
  s.row_dir.clear();
  s.ratios.clear();
  s.ch_err.assign(nc, 0.0);
  s.ch_ref.assign(nc, 0.0);
  if (opts.breakdown) m.nmse_per_token.reserve(rows);

  const auto [sum_cos, min_cos, max_abs] = accumulate_rows(x, xh, rows, nc, opts, row_mask, s, m);
  const std::size_t nr = s.row_err.size();
  m.rows = static_cast<std::int64_t>(nr);
  const std::size_t n = nr * nc;
  if (nr == 0 || nc == 0) {
    m.nmse_per_token.clear();
    return m;
  }
  m.mse = m.sum_sq_err / static_cast<double>(n);
  m.nmse = safe_nmse(m.sum_sq_err, m.sum_sq_ref);
  m.snr_db = snr_db_from_nmse(m.nmse);
  m.rel_fro = std::sqrt(m.nmse);
  m.max_abs = max_abs;
  {
    static constexpr double kLevels[] = {0.99, 0.999};
    double out[2];
    percentiles_inplace(std::span<float>(s.abs_err.data(), n), kLevels, out);
    m.p99_abs = out[0];
    m.p999_abs = out[1];
  }
  m.mean_cos = sum_cos / static_cast<double>(nr);
  m.min_cos = min_cos;
  const double decomposed = m.magnitude_err + m.direction_err;
  m.magnitude_share = decomposed > 0 ? m.magnitude_err / decomposed : 0.0;

  top_row_shares(s, nr, m);
  norm_ratio_stats(s, m);
  if (opts.breakdown) {
    m.nmse_per_channel.resize(nc);
    for (std::size_t c = 0; c < nc; ++c)
      m.nmse_per_channel[c] = safe_nmse(s.ch_err[c], s.ch_ref[c]);
  } else {
    m.nmse_per_token.clear();
  }
  return m;
}

nlohmann::json json_number(double x) {
  if (std::isfinite(x)) return x;
  if (std::isnan(x)) return "nan";
  return x > 0 ? "inf" : "-inf";
}

void to_json(nlohmann::json& j, const ReconstructionMetrics& m) {
  auto vec = [](const std::vector<double>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (double x : v) a.push_back(json_number(x));
    return a;
  };
  j = nlohmann::json{{"rows", m.rows},
                     {"cols", m.cols},
                     {"sum_sq_ref", json_number(m.sum_sq_ref)},
                     {"sum_sq_hat", json_number(m.sum_sq_hat)},
                     {"sum_sq_err", json_number(m.sum_sq_err)},
                     {"mse", json_number(m.mse)},
                     {"nmse", json_number(m.nmse)},
                     {"snr_db", json_number(m.snr_db)},
                     {"rel_fro", json_number(m.rel_fro)},
                     {"max_abs", json_number(m.max_abs)},
                     {"p99_abs", json_number(m.p99_abs)},
                     {"p999_abs", json_number(m.p999_abs)},
                     {"mean_cos", json_number(m.mean_cos)},
                     {"min_cos", json_number(m.min_cos)},
                     {"magnitude_err", json_number(m.magnitude_err)},
                     {"direction_err", json_number(m.direction_err)},
                     {"magnitude_share", json_number(m.magnitude_share)},
                     {"top_row_fractions", kTopRowFractions},
                     {"top_magnitude_share", m.top_magnitude_share},
                     {"norm_ratio_mean", json_number(m.norm_ratio_mean)},
                     {"norm_ratio_p1", json_number(m.norm_ratio_p1)},
                     {"norm_ratio_p99", json_number(m.norm_ratio_p99)},
                     {"zero_ref_rows", m.zero_ref_rows}};
  if (!m.nmse_per_channel.empty()) j["nmse_per_channel"] = vec(m.nmse_per_channel);
  if (!m.nmse_per_token.empty()) j["nmse_per_token"] = vec(m.nmse_per_token);
}

}  // namespace kvarn
