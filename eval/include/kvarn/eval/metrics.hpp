// Reconstruction metrics of x̂ against x, defined once for every path (CPU reference now, GPU
// later). Formulas and the zero conventions are in docs/metrics.md.
//
// Inputs are row-major [rows, cols] float arrays, rows = tokens and cols = channels. Every sum is
// accumulated in double. No metric is ever NaN:
//   - NMSE (and per-channel / per-token NMSE) = 0 when x and x̂ are both zero, +inf when only x is.
//   - SNR dB = -10 log10(NMSE) clamped to [-kSnrCapDb, +kSnrCapDb] (exact reconstruction reports
//     +kSnrCapDb), so it stays finite, JSON-safe and averageable.
//   - cosine of a row = 1 when both rows are zero, 0 when exactly one is.
//   - norm ratio ‖x̂‖/‖x‖ = 1 when both rows are zero; rows with ‖x‖ = 0 < ‖x̂‖ are left out of the
//     ratio statistics and counted in zero_ref_rows.
#ifndef KVARN_EVAL_METRICS_HPP_
#define KVARN_EVAL_METRICS_HPP_

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

namespace kvarn {

inline constexpr double kSnrCapDb = 999.0;
// Fractions of rows (largest row errors first) whose magnitude-error share is reported.
inline constexpr std::array<double, 3> kTopRowFractions = {0.001, 0.01, 0.05};

struct MetricOptions {
  bool breakdown = true;  // fill nmse_per_channel / nmse_per_token
};

struct ReconstructionMetrics {
  std::int64_t rows = 0, cols = 0;
  double sum_sq_ref = 0;  // ‖x‖²
  double sum_sq_hat = 0;  // ‖x̂‖²
  double sum_sq_err = 0;  // ‖x − x̂‖²
  double mse = 0;         // ‖x − x̂‖² / (rows·cols)
  double nmse = 0;        // ‖x − x̂‖² / ‖x‖²
  double snr_db = kSnrCapDb;
  double rel_fro = 0;  // sqrt(nmse)
  double max_abs = 0;  // max |x − x̂|
  double p99_abs = 0;  // linear-interpolated percentiles of |x − x̂| over all entries
  double p999_abs = 0;
  double mean_cos = 1;  // mean over rows of cos(x_t, x̂_t)
  double min_cos = 1;
  // ‖x_t − x̂_t‖² = (‖x_t‖ − ‖x̂_t‖)² + 2‖x_t‖‖x̂_t‖(1 − cos θ_t), summed over rows.
  double magnitude_err = 0;
  double direction_err = 0;
  double magnitude_share = 0;  // magnitude / (magnitude + direction); 0 when both are 0
  // Magnitude share within the ceil(f·rows) rows of largest ‖x_t − x̂_t‖², f in kTopRowFractions.
  std::array<double, 3> top_magnitude_share = {0, 0, 0};
  // ‖x̂_t‖ / ‖x_t‖ over rows.
  double norm_ratio_mean = 1, norm_ratio_p1 = 1, norm_ratio_p99 = 1;
  std::int64_t zero_ref_rows = 0;        // rows with ‖x_t‖ = 0
  std::vector<double> nmse_per_channel;  // [cols] (empty unless MetricOptions::breakdown)
  std::vector<double> nmse_per_token;    // [rows]
};

// x, x_hat: [rows, cols] row-major. row_mask (optional, [rows]): only rows with a non-zero entry
// are measured (e.g. the tokens a method really quantized); rows/ per-token then count those only.
ReconstructionMetrics reconstruction_metrics(const float* x, const float* x_hat, int rows, int cols,
                                             const MetricOptions& opts = {},
                                             const std::uint8_t* row_mask = nullptr);

// ‖x − x̂‖² / ‖x‖² with the conventions above (0/0 = 0, e/0 = +inf).
double safe_nmse(double err, double ref);
// -10 log10(nmse), clamped to ±kSnrCapDb.
double snr_db_from_nmse(double nmse);

// Linear-interpolation percentiles (numpy "linear") of `values`, which are reordered in place
// (nth_element, no full sort). `ps` in [0, 1], any order; out[i] receives percentile ps[i].
void percentiles_inplace(std::span<float> values, std::span<const double> ps,
                         std::span<double> out);
void percentiles_inplace(std::span<double> values, std::span<const double> ps,
                         std::span<double> out);

// JSON number, or the string "inf" / "-inf" / "nan" for a non-finite value (JSON has none).
nlohmann::json json_number(double x);
void to_json(nlohmann::json& j, const ReconstructionMetrics& m);

}  // namespace kvarn

#endif  // KVARN_EVAL_METRICS_HPP_
