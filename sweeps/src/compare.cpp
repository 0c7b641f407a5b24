// Regression compare of two summary.jsonl files with per-family tolerances.
#include "kvarn/sweeps/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "kvarn/data/error.hpp"
#include "kvarn/data/read_file.hpp"

namespace kvarn {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string trim(const std::string& s) {
  const auto a = s.find_first_not_of(" \t");
  const auto b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

double parse_number(const std::string& text, const std::string& where) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KVARN_CHECK(used == text.size() && used > 0 && std::isfinite(x) && x >= 0, "--tolerance ", where,
              ": '", text, "' is not a non-negative number");
  return x;
}

// JSON number, or eval's "inf" / "-inf" / "nan" strings; anything else is damage, not a NaN.
double value_of(const json& v, const std::string& where) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  fail(where, ": key 'value' is ", v.dump().substr(0, 40),
       ", not a number (or \"nan\", \"inf\", \"-inf\")");
}

std::string cell(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

struct Loaded {
  std::map<std::string, std::pair<json, double>> rows;  // key -> (row, value)
};

Loaded load_summary(const fs::path& p) {
  fs::path file = p;
  if (fs::is_directory(p)) file = p / "summary.jsonl";
  std::error_code ec;
  KVARN_CHECK(fs::exists(file, ec), file.string(),
              ": cannot open (a run directory or its summary.jsonl)");
  Loaded out;
  for (SummaryRow& r : parse_summary_jsonl(read_regular_file(file, "summary"), file.string())) {
    const std::string key = cell(r.row.value("data", json("-"))) + " | " + cell(r.row["spec"]) +
                            " | " + cell(r.row["metric"]) + " | " + cell(r.row["scope"]) + " | " +
                            cell(r.row["layer"]) + " | " + cell(r.row["head"]);
    KVARN_CHECK(!out.rows.count(key), file.string(), ":", r.line, ": duplicate row ", key);
    out.rows[key] = {std::move(r.row), r.value};
  }
  return out;
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

}  // namespace

std::vector<SummaryRow> parse_summary_jsonl(const std::string& text, const std::string& where) {
  std::vector<SummaryRow> out;
  std::size_t start = 0;
  for (int n = 1; start < text.size(); ++n) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (trim(line).empty()) continue;
    const std::string at = where + ":" + std::to_string(n);
    json row;
    try {
      row = json::parse(line, nullptr, false);
    } catch (const json::exception& e) {  // a number beyond double's range throws regardless
      fail(at, ": not valid JSON: ", without_tag(e.what()));
    }
    KVARN_CHECK(!row.is_discarded() && row.is_object(), at, ": not a JSON object row");
    for (const char* k : {"spec", "metric", "scope", "layer", "head", "value"}) {
      KVARN_CHECK(row.contains(k), at, ": row has no key '", k, "'");
    }
    const double v = value_of(row["value"], at);
    out.push_back({n, row, v});
  }
  return out;
}

// The bootstrap CI a base row carries (summary columns ci_lo, ci_hi; numbers or eval's
// "inf"/"-inf" strings); false when it has none.
static bool base_ci(const json& row, double* lo, double* hi) {
  auto num = [](const json& v, double* out) {
    if (v.is_number()) {
      *out = v.get<double>();
      return std::isfinite(*out);
    }
    return false;
  };
  return row.contains("ci_lo") && row.contains("ci_hi") && num(row["ci_lo"], lo) &&
         num(row["ci_hi"], hi) && *lo <= *hi;
}

// Dot-separated components of a metric name ("key.end_to_end.nmse" -> key, end_to_end, nmse).
static std::vector<std::string> components(const std::string& metric) {
  std::vector<std::string> out;
  std::stringstream ss(metric);
  for (std::string c; std::getline(ss, c, '.');) out.push_back(c);
  return out;
}

// A family matches the whole name by prefix ("key.stage") or any component by prefix ("nmse",
// "kl"); the longest matching family wins.
const Tolerance& ToleranceSpec::lookup(const std::string& metric) const {
  const Tolerance* best = &fallback;
  std::size_t best_len = 0;
  const std::vector<std::string> parts = components(metric);
  for (const auto& [prefix, tol] : families) {
    bool match = starts_with(metric, prefix);
    for (const std::string& c : parts) match = match || starts_with(c, prefix);
    if (match && prefix.size() >= best_len) {
      best = &tol;
      best_len = prefix.size();
    }
  }
  return *best;
}

ToleranceSpec parse_tolerance(const std::string& text) {
  // Family entries inherit whatever they leave out from the (final) default entry.
  struct Entry {
    std::string family;
    std::optional<double> rel, abs;
  };
  std::vector<Entry> entries;
  bool use_ci = false;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ';');) {
    item = trim(item);
    if (item.empty()) continue;
    if (item == "ci") {
      use_ci = true;
      continue;
    }
    const auto colon = item.find(':');
    KVARN_CHECK(colon != std::string::npos && colon > 0, "--tolerance '", item,
                "': expected FAMILY:rel=X,abs=Y (e.g. nmse:rel=0.01) or ci");
    Entry e;
    e.family = trim(item.substr(0, colon));
    std::stringstream ps(item.substr(colon + 1));
    for (std::string kv; std::getline(ps, kv, ',');) {
      kv = trim(kv);
      const auto eq = kv.find('=');
      KVARN_CHECK(eq != std::string::npos, "--tolerance ", e.family, ": '", kv,
                  "' is not rel=X or abs=Y");
      const std::string k = trim(kv.substr(0, eq));
      const double v = parse_number(trim(kv.substr(eq + 1)), e.family + "." + k);
      if (k == "rel") {
        e.rel = v;
      } else if (k == "abs") {
        e.abs = v;
      } else {
        fail("--tolerance ", e.family, ": unknown key '", k, "' (rel or abs)");
      }
    }
    KVARN_CHECK(e.rel || e.abs, "--tolerance ", e.family, ": give rel=X and/or abs=Y");
    entries.push_back(e);
  }
  ToleranceSpec spec;
  spec.use_ci = use_ci;
  for (const Entry& e : entries) {
    if (e.family != "default") continue;
    if (e.rel) spec.fallback.rel = *e.rel;
    if (e.abs) spec.fallback.abs = *e.abs;
  }
  for (const Entry& e : entries) {
    if (e.family == "default") continue;
    spec.families.emplace_back(
        e.family, Tolerance{e.rel.value_or(spec.fallback.rel), e.abs.value_or(spec.fallback.abs)});
  }
  return spec;
}

Direction metric_direction(const std::string& m) {
  for (const std::string& c : components(m)) {
    for (const char* p : {"snr", "cos", "topk"}) {
      if (starts_with(c, p)) return Direction::kHigherIsBetter;
    }
    for (const char* p : {"imbalance", "magnitude_share", "best_iter", "effective_bits",
                          "outlier_k_err_share", "rows"}) {
      if (starts_with(c, p)) return Direction::kNeutral;
    }
  }
  return Direction::kLowerIsBetter;
}

bool CompareResult::regressed() const {
  return std::any_of(changed.begin(), changed.end(),
                     [](const CompareRow& r) { return r.regressed; });
}

json CompareResult::to_json() const {
  json rows = json::array();
  auto num = [](double x) {
    return std::isfinite(x) ? json(x) : json(std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf"));
  };
  for (const CompareRow& r : changed) {
    rows.push_back({{"data", r.data},
                    {"spec", r.spec},
                    {"metric", r.metric},
                    {"scope", r.scope},
                    {"layer", r.layer},
                    {"head", r.head},
                    {"base", r.in_base ? num(r.base) : json(nullptr)},
                    {"new", r.in_new ? num(r.now) : json(nullptr)},
                    {"abs_change", num(r.abs_change)},
                    {"rel_change", num(r.rel_change)},
                    {"base_ci", r.has_ci ? json::array({r.ci_lo, r.ci_hi}) : json(nullptr)},
                    {"status", !r.in_new     ? "missing_in_new"
                               : !r.in_base  ? "only_in_new"
                               : r.regressed ? "regressed"
                                             : "improved_or_changed"}});
  }
  return {{"base_rows", base_rows},
          {"new_rows", new_rows},
          {"matched", matched},
          {"unchanged", unchanged},
          {"within_tolerance", within_tolerance},
          {"within_ci", within_ci},
          {"regressed", regressed()},
          {"changed", rows}};
}

CompareResult compare_runs(const fs::path& base, const fs::path& now, const ToleranceSpec& tol) {
  const Loaded a = load_summary(base), b = load_summary(now);
  CompareResult r;
  r.base_rows = a.rows.size();
  r.new_rows = b.rows.size();
  auto fill = [](CompareRow& row, const std::string& key, const json& j) {
    row.key = key;
    row.data = cell(j.value("data", json("-")));
    row.spec = cell(j["spec"]);
    row.metric = cell(j["metric"]);
    row.scope = cell(j["scope"]);
    row.layer = cell(j["layer"]);
    row.head = cell(j["head"]);
  };
  for (const auto& [key, av] : a.rows) {
    CompareRow row;
    fill(row, key, av.first);
    row.base = av.second;
    const auto it = b.rows.find(key);
    if (it == b.rows.end()) {
      row.in_new = false;
      row.regressed = true;  // a metric that disappeared is a regression
      r.changed.push_back(row);
      continue;
    }
    ++r.matched;
    row.now = it->second.second;
    const double x = row.base, y = row.now;
    // A NaN is never "unchanged": NaN on either side is a failed metric, a regression.
    if (std::isnan(x) || std::isnan(y)) {
      row.abs_change = row.rel_change = std::numeric_limits<double>::quiet_NaN();
      row.beyond = row.regressed = true;
      r.changed.push_back(row);
      continue;
    }
    if (x == y) {
      ++r.unchanged;
      continue;
    }
    row.abs_change = y - x;
    row.rel_change = x != 0 ? (y - x) / std::fabs(x) : std::numeric_limits<double>::infinity();
    const Tolerance& t = tol.lookup(row.metric);
    const double allowed = std::max(t.abs, t.rel * std::fabs(x));
    row.beyond = !(std::fabs(y - x) <= allowed);  // NaN or inf changes are beyond
    if (!row.beyond) {
      ++r.within_tolerance;
      continue;
    }
    if (tol.use_ci && base_ci(av.first, &row.ci_lo, &row.ci_hi)) {
      row.has_ci = true;
      if (row.ci_lo <= y && y <= row.ci_hi) {
        ++r.within_ci;
        continue;
      }
    }
    switch (metric_direction(row.metric)) {
      case Direction::kLowerIsBetter:
        row.regressed = !(y < x);
        break;
      case Direction::kHigherIsBetter:
        row.regressed = !(y > x);
        break;
      case Direction::kNeutral:
        row.regressed = true;
        break;
    }
    r.changed.push_back(row);
  }
  for (const auto& [key, bv] : b.rows) {
    if (a.rows.count(key)) continue;
    CompareRow row;
    fill(row, key, bv.first);
    row.in_base = false;
    row.now = bv.second;
    r.changed.push_back(row);
  }
  return r;
}

std::string format_compare_table(const CompareResult& r) {
  std::ostringstream os;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "rows: base %zu, new %zu, matched %zu (identical %zu, within tolerance %zu, "
                "inside the base CI %zu)\n",
                r.base_rows, r.new_rows, r.matched, r.unchanged, r.within_tolerance, r.within_ci);
  os << buf;
  if (r.changed.empty()) {
    os << "no metric changed beyond tolerance\n";
    return os.str();
  }
  std::snprintf(buf, sizeof(buf), "%-10s %-34s %-34s %-9s %-5s %-5s %13s %13s %11s %10s\n",
                "status", "spec", "metric", "scope", "layer", "head", "base", "new", "abs", "rel");
  os << buf;
  for (const CompareRow& c : r.changed) {
    const char* status = !c.in_new     ? "MISSING"
                         : !c.in_base  ? "new-only"
                         : c.regressed ? "REGRESSED"
                                       : "improved";
    std::string spec = c.spec;
    if (c.data != "-" && !c.data.empty()) spec = c.data + ":" + spec;
    if (spec.size() > 34) spec = spec.substr(0, 31) + "...";
    auto fmt = [](bool present, double x) {
      char b[32];
      if (!present) return std::string("-");
      std::snprintf(b, sizeof(b), "%.6g", x);
      return std::string(b);
    };
    std::snprintf(buf, sizeof(buf), "%-10s %-34s %-34s %-9s %-5s %-5s %13s %13s %11s %10s\n",
                  status, spec.c_str(), c.metric.c_str(), c.scope.c_str(), c.layer.c_str(),
                  c.head.c_str(), fmt(c.in_base, c.base).c_str(), fmt(c.in_new, c.now).c_str(),
                  fmt(c.in_base && c.in_new, c.abs_change).c_str(),
                  fmt(c.in_base && c.in_new, c.rel_change).c_str());
    os << buf;
  }
  std::size_t reg = 0;
  for (const CompareRow& c : r.changed) reg += c.regressed ? 1 : 0;
  os << reg << " regression(s), " << r.changed.size() - reg << " other change(s)\n";
  return os.str();
}

}  // namespace kvarn
