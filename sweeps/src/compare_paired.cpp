// Paired-difference compare over the units behind the rows' CIs (compare_paired.hpp).
#include "kvarn/sweeps/compare_paired.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "kvarn/data/error.hpp"
#include "kvarn/eval/metrics.hpp"
#include "kvarn/sweeps/compare.hpp"
#include "kvarn/sweeps/store.hpp"

namespace kvarn {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using UnitMap = std::map<std::string, double>;

constexpr const char* kSep = " | ";

// A unit value of a record: a number or eval's "nan"/"inf" strings (left out, as non-finite).
std::optional<double> finite_value(const json& v) {
  if (!v.is_number()) return std::nullopt;
  const double x = v.get<double>();
  return std::isfinite(x) ? std::optional<double>(x) : std::nullopt;
}

// Sums per unit (and counts) of one spec, averaged once every record is read.
struct Accum {
  std::map<std::string, std::map<std::string, std::pair<double, int>>> cells;
  void add(const std::string& key, const std::string& unit, const json& v) {
    if (const auto x = finite_value(v)) {
      auto& c = cells[key][unit];
      c.first += *x;
      ++c.second;
    }
  }
};

void read_record_units(const json& rec, const std::string& where, Accum& acc) {
  if (rec.contains("units")) {
    KVARN_CHECK(rec["units"].is_object(), where, ": key 'units' must be an object");
    for (const auto& [data, metrics] : rec["units"].items()) {
      KVARN_CHECK(metrics.is_object(), where, ": units.", data, " must be an object");
      for (const auto& [metric, units] : metrics.items()) {
        KVARN_CHECK(units.is_object(), where, ": units.", data, ".", metric, " must be an object");
        for (const auto& [unit, v] : units.items()) acc.add(data + kSep + metric, unit, v);
      }
    }
  }
  // The model loop's units are its prompts: each prompt's summary holds its metric values.
  const json* acc_block = rec.contains("accumulation") ? &rec["accumulation"] : nullptr;
  if (!acc_block || !acc_block->is_object() || !acc_block->contains("models")) return;
  for (const json& m : (*acc_block)["models"]) {
    if (!m.is_object() || !m.contains("prompts") || !m["prompts"].is_array()) continue;
    const std::string data = m.value("model", std::string("-"));
    for (const json& p : m["prompts"]) {
      if (!p.is_object() || !p.contains("summary") || !p["summary"].is_object()) continue;
      KVARN_CHECK(p.contains("prompt_id") && p["prompt_id"].is_string(), where,
                  ": accumulation.models[", data, "]: a prompt without a string prompt_id");
      const std::string unit = p["prompt_id"].get<std::string>();
      for (const auto& [metric, v] : p["summary"].items()) acc.add(data + kSep + metric, unit, v);
    }
  }
}

bool wanted(const std::string& metric, const std::vector<std::string>& prefixes) {
  if (prefixes.empty()) return true;
  for (const std::string& p : prefixes)
    if (metric.rfind(p, 0) == 0) return true;
  return false;
}

PairedRow test_key(const std::string& key, const UnitMap& a, const UnitMap& b,
                   const BootstrapOptions& o) {
  PairedRow row = paired_row(a, b, o);
  const auto bar = key.find(kSep);
  row.data = key.substr(0, bar);
  row.metric = key.substr(bar + std::string(kSep).size());
  return row;
}

// Every (data, metric) both specs hold, filtered by the metric prefixes.
void pair_specs(const RunUnits& ra, const std::string& sa, const RunUnits& rb,
                const std::string& sb, const PairedOptions& o, PairedResult& out) {
  const auto& a = ra.by_spec.at(sa);
  const auto& b = rb.by_spec.at(sb);
  for (const auto& [key, ua] : a) {
    const auto it = b.find(key);
    if (it == b.end()) continue;
    PairedRow row = test_key(key, ua, it->second, o.bootstrap);
    if (!wanted(row.metric, o.metrics)) continue;
    row.spec_a = sa;
    row.spec_b = sb;
    out.rows.push_back(std::move(row));
  }
}

std::string fmt(double x) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.4g", x);
  return b;
}

}  // namespace

RunUnits load_run_units(const fs::path& run_dir) {
  const fs::path resolved_path = run_dir / "resolved.json";
  KVARN_CHECK(fs::is_regular_file(resolved_path), resolved_path.string(),
              ": not found (the paired compare reads a run directory's case records)");
  const RunStore store(run_dir);
  std::map<std::string, Accum> acc;
  RunUnits out;
  for (const ResolvedCase& c :
       resolved_cases(read_json_file(resolved_path), resolved_path.string())) {
    const fs::path p = store.case_path(c.id);
    if (!fs::is_regular_file(p)) continue;  // unfinished case
    const json rec = read_json_file(p);
    KVARN_CHECK(rec.is_object(), p.string(), ": a case record must be a JSON object");
    read_record_units(rec, p.string(), acc[c.spec]);
    out.name_of[c.spec] = rec.value("name", c.spec);
  }
  for (const auto& [spec, a] : acc) {
    auto& dst = out.by_spec[spec];
    for (const auto& [key, units] : a.cells)
      for (const auto& [unit, sum_n] : units) dst[key][unit] = sum_n.first / sum_n.second;
  }
  return out;
}

std::string find_run_spec(const RunUnits& run, const std::string& method) {
  if (run.by_spec.count(method)) return method;
  std::string have;
  for (const auto& [spec, name] : run.name_of) {
    if (name == method && run.by_spec.count(spec)) return spec;
    have += (have.empty() ? "" : ", ") + name;
  }
  fail("--methods: no finished case of '", method, "' in the run (methods: ", have, ")");
}

PairedRow paired_row(const UnitMap& a, const UnitMap& b, const BootstrapOptions& o) {
  PairedRow row;
  std::vector<double> xa, xb;
  for (const auto& [unit, va] : a) {
    const auto it = b.find(unit);
    if (it == b.end()) continue;
    xa.push_back(va);
    xb.push_back(it->second);
  }
  row.units = static_cast<int>(xa.size());
  for (std::size_t i = 0; i < xa.size(); ++i) {
    row.mean_a += xa[i] / static_cast<double>(xa.size());
    row.mean_b += xb[i] / static_cast<double>(xb.size());
  }
  if (xa.size() >= 2) {
    row.test = paired_bootstrap(xa, xb, o);
    row.flagged = row.test->significant;
  }
  return row;
}

std::size_t PairedResult::flagged() const {
  std::size_t n = 0;
  for (const PairedRow& r : rows) n += r.flagged ? 1 : 0;
  return n;
}

bool PairedResult::regressed() const {
  for (const PairedRow& r : rows)
    if (r.regressed) return true;
  return false;
}

PairedResult compare_paired_runs(const RunUnits& base, const RunUnits& now,
                                 const PairedOptions& o) {
  PairedResult out;
  out.between_runs = true;
  out.bootstrap = o.bootstrap;
  for (const auto& [spec, units] : now.by_spec) {
    if (!base.by_spec.count(spec)) continue;
    pair_specs(now, spec, base, spec, o, out);
  }
  for (PairedRow& r : out.rows) {
    if (!r.flagged) continue;
    const double d = r.test->difference.estimate;  // new - base
    switch (metric_direction(r.metric)) {
      case Direction::kLowerIsBetter:
        r.regressed = d > 0;
        break;
      case Direction::kHigherIsBetter:
        r.regressed = d < 0;
        break;
      case Direction::kNeutral:
        r.regressed = true;
        break;
    }
  }
  return out;
}

PairedResult compare_paired_methods(const RunUnits& run, const std::string& method_a,
                                    const std::string& method_b, const PairedOptions& o) {
  PairedResult out;
  out.between_runs = false;
  out.bootstrap = o.bootstrap;
  pair_specs(run, find_run_spec(run, method_a), run, find_run_spec(run, method_b), o, out);
  return out;
}

json PairedResult::to_json() const {
  json rows_j = json::array();
  for (const PairedRow& r : rows) {
    json j = {{"data", r.data},
              {"metric", r.metric},
              {between_runs ? "spec" : "spec_a", r.spec_a},
              {between_runs ? "new" : "a", json_number(r.mean_a)},
              {between_runs ? "base" : "b", json_number(r.mean_b)},
              {"units", r.units},
              {"difference", r.test ? kvarn::to_json(*r.test) : json(nullptr)},
              {"flagged", r.flagged}};
    if (between_runs) {
      j["regressed"] = r.regressed;
    } else {
      j["spec_b"] = r.spec_b;
    }
    rows_j.push_back(std::move(j));
  }
  return {
      {"mode", between_runs ? "paired: new - base, same method" : "paired: A - B, one run"},
      {"bootstrap",
       {{"resamples", bootstrap.resamples}, {"level", bootstrap.level}, {"seed", bootstrap.seed}}},
      {"rows", std::move(rows_j)},
      {"flagged", flagged()},
      {"regressed", regressed()}};
}

std::string format_paired_table(const PairedResult& r) {
  std::ostringstream os;
  os << (r.between_runs ? "paired differences new - base over shared units"
                        : "paired differences A - B over shared units")
     << " (percentile bootstrap, " << r.bootstrap.resamples << " resamples, "
     << r.bootstrap.level * 100 << " %, seed " << r.bootstrap.seed
     << "); flagged only when the CI excludes 0\n";
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%-10s %-24s %-44s %-26s %11s %11s %5s %11s %24s\n", "status",
                "data", "metric", r.between_runs ? "spec" : "A vs B", r.between_runs ? "new" : "A",
                r.between_runs ? "base" : "B", "units", "diff", "95 % CI");
  os << buf;
  for (const PairedRow& x : r.rows) {
    const char* status = x.regressed ? "REGRESSED"
                         : x.flagged ? "differs"
                         : x.test    ? "n.s."
                                     : "untested";
    std::string spec = r.between_runs ? x.spec_a : x.spec_a + " vs " + x.spec_b;
    if (spec.size() > 26) spec = spec.substr(0, 23) + "...";
    std::string diff = fmt(x.mean_a - x.mean_b);
    char ci[64] = "-";
    if (x.test) {
      diff = fmt(x.test->difference.estimate);
      std::snprintf(ci, sizeof(ci), "[%.4g, %.4g]", x.test->difference.lo, x.test->difference.hi);
    }
    std::snprintf(buf, sizeof(buf), "%-10s %-24s %-44s %-26s %11s %11s %5d %11s %24s\n", status,
                  x.data.substr(0, 24).c_str(), x.metric.substr(0, 44).c_str(), spec.c_str(),
                  fmt(x.mean_a).c_str(), fmt(x.mean_b).c_str(), x.units, diff.c_str(), ci);
    os << buf;
  }
  std::size_t reg = 0;
  for (const PairedRow& x : r.rows) reg += x.regressed ? 1 : 0;
  os << r.rows.size() << " paired row(s), " << r.flagged() << " with a CI excluding 0";
  if (r.between_runs) os << ", " << reg << " regression(s)";
  os << "\n";
  return os.str();
}

}  // namespace kvarn
