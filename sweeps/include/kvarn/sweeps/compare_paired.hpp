// Paired-difference compare of two runs, or of two methods within one run (docs/results.md,
// "Compare"; docs/metrics.md, "Confidence intervals").
//
// The units are those behind the summary rows' CIs, read from the case records: tiles files'
// (sequence, layer, KV head) slabs (the record's `units`: {data: {metric: {unit: value}}}) and
// the model loop's prompts (`accumulation.models[].prompts[].summary`). For each (data, metric)
// both sides hold, the differences new - base (two runs, same method spec) or A - B (two methods
// of one run) over the units both hold are bootstrapped (eval's paired_bootstrap; seeded,
// recorded). A difference is flagged only when its CI excludes 0; between runs, a flagged
// difference in the metric's bad direction (compare.hpp's metric_direction; any direction for a
// neutral metric) is a regression. Fewer than 2 shared units: untested, never flagged.
#ifndef KVARN_SWEEPS_COMPARE_PAIRED_HPP_
#define KVARN_SWEEPS_COMPARE_PAIRED_HPP_

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kvarn/eval/bootstrap.hpp"

namespace kvarn {

// Per-unit values of one run: spec -> "data | metric" -> unit -> value. Several cases of one spec
// (e.g. seeds) are averaged per unit; NaN/Inf unit values are left out.
struct RunUnits {
  std::map<std::string, std::map<std::string, std::map<std::string, double>>> by_spec;
  std::map<std::string, std::string> name_of;  // spec -> method name as configured
};

// Reads `run_dir`'s resolved.json and every finished case record. Throws kvarn::Error naming the
// file on a missing run or malformed record.
RunUnits load_run_units(const std::filesystem::path& run_dir);

// The canonical spec of `method` (a spec or a configured method name) in `run`; throws naming
// the methods the run holds when there is none.
std::string find_run_spec(const RunUnits& run, const std::string& method);

struct PairedOptions {
  BootstrapOptions bootstrap;        // defaults: 2000 resamples, 95 %, seed 0
  std::vector<std::string> metrics;  // metric-name prefixes; empty: every metric with units
};

struct PairedRow {
  std::string data, metric, spec_a, spec_b;  // between runs: spec_a = spec_b, a = new, b = base
  double mean_a = 0, mean_b = 0;             // over the shared units
  int units = 0;                             // shared units
  std::optional<PairedComparison> test;      // none with fewer than 2 shared units
  bool flagged = false;                      // the CI of the difference excludes 0
  bool regressed = false;                    // between runs: flagged in the bad direction
};

struct PairedResult {
  bool between_runs = true;
  BootstrapOptions bootstrap;
  std::vector<PairedRow> rows;
  std::size_t flagged() const;
  bool regressed() const;
  nlohmann::json to_json() const;
};

// Tests one pair of per-unit value maps (the units both hold, in unit order).
PairedRow paired_row(const std::map<std::string, double>& a, const std::map<std::string, double>& b,
                     const BootstrapOptions& o);

// Every method spec both runs hold: new - base.
PairedResult compare_paired_runs(const RunUnits& base, const RunUnits& now, const PairedOptions& o);
// Two methods of one run: A - B.
PairedResult compare_paired_methods(const RunUnits& run, const std::string& method_a,
                                    const std::string& method_b, const PairedOptions& o);

std::string format_paired_table(const PairedResult& r);

}  // namespace kvarn

#endif  // KVARN_SWEEPS_COMPARE_PAIRED_HPP_
