// Regression compare of two runs' summary.jsonl (docs/results.md, "Compare").
//
// Rows are joined on (data, spec, metric, scope, layer, head). Tolerances are per metric family:
// a family matches a metric when the metric name, or one of its dot-separated components, starts
// with it (longest family wins), e.g.
//   default:rel=1e-6,abs=1e-9;nmse:rel=0.01;kl:rel=0.05,abs=1e-6
// ("nmse" matches key.end_to_end.nmse, "kl" matches attention.kl.mean). A change is beyond
// tolerance when |new - base| > max(abs, rel * |base|). Direction, by name component: error
// metrics (the default) regress when they grow; snr*, cos*, topk* regress when they shrink;
// neutral metrics (imbalance*, magnitude_share, best_iter*, effective_bits, outlier_k_err_share)
// regress on any change beyond tolerance. A row present only in the base is a regression, and so
// is a NaN value on either side (a NaN is never "unchanged").
//
// The entry `ci` (e.g. "ci" or "ci;nmse:rel=0.01") adds a statistical test: a row whose base
// carries a bootstrap CI (ci_lo, ci_hi) is beyond tolerance only when the new value lies outside
// that interval AND beyond the numeric tolerance (which still absorbs rounding where the interval
// is degenerate); rows without a CI use the numeric tolerance alone.
#ifndef KVARN_SWEEPS_COMPARE_HPP_
#define KVARN_SWEEPS_COMPARE_HPP_

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvarn {

inline constexpr const char* kDefaultTolerance = "default:rel=1e-6,abs=1e-9";

struct Tolerance {
  double rel = 1e-6, abs = 1e-9;
};

struct ToleranceSpec {
  Tolerance fallback;
  bool use_ci = false;  // the "ci" entry: rows with a base CI must also leave it
  std::vector<std::pair<std::string, Tolerance>> families;  // prefix -> tolerance
  const Tolerance& lookup(const std::string& metric) const;
};

// Starts from kDefaultTolerance; entries override it. Throws kvarn::Error on bad syntax.
ToleranceSpec parse_tolerance(const std::string& text);

enum class Direction { kLowerIsBetter, kHigherIsBetter, kNeutral };
Direction metric_direction(const std::string& metric);

struct CompareRow {
  std::string key;  // "data | spec | metric | scope | layer | head"
  std::string data, spec, metric, scope, layer, head;
  double base = 0, now = 0, abs_change = 0, rel_change = 0;
  bool in_base = true, in_new = true;
  bool beyond = false;     // outside tolerance
  bool regressed = false;  // beyond, in the bad direction (or missing from new)
  bool has_ci = false;     // judged against the base run's CI (ToleranceSpec::use_ci)
  double ci_lo = 0, ci_hi = 0;
};

struct CompareResult {
  std::size_t base_rows = 0, new_rows = 0, matched = 0, unchanged = 0, within_tolerance = 0;
  std::size_t within_ci = 0;        // changed beyond the numeric tolerance but inside the base CI
  std::vector<CompareRow> changed;  // beyond tolerance or present on one side only
  bool regressed() const;
  nlohmann::json to_json() const;
};

// One row of summary.jsonl: its line number, the row and its value ("nan"/"inf"/"-inf" strings
// mapped to doubles).
struct SummaryRow {
  int line = 0;
  nlohmann::json row;
  double value = 0;
};
// Parses summary.jsonl text; a row that is not a JSON object, lacks a key compare needs or has
// a value that is not a number (or "nan", "inf", "-inf") throws kvarn::Error naming
// `where`:LINE and the key.
std::vector<SummaryRow> parse_summary_jsonl(const std::string& text, const std::string& where);

// `base` / `now`: run directories or summary.jsonl files.
CompareResult compare_runs(const std::filesystem::path& base, const std::filesystem::path& now,
                           const ToleranceSpec& tol);
std::string format_compare_table(const CompareResult& r);

}  // namespace kvarn

#endif  // KVARN_SWEEPS_COMPARE_HPP_
