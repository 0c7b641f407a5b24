// The `methods` list: plain names and specs, and grids (the cartesian product of their axes,
// last axis fastest), resolved through the registry into deduplicated cases. The number of
// combinations is counted before anything is expanded and bounded by kMaxMethodCombinations;
// combinations are then visited one at a time, so only distinct cases are ever held.
#include <limits>
#include <memory>

#include "config_parse.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/provenance.hpp"

namespace kvarn::config_detail {

namespace {

struct MethodInput {
  std::string text;
  YAML::Node node;
  std::string key;
};

struct Grid {
  std::string family;
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;
  std::int64_t combinations = 1;  // the product of the axis sizes, saturated at INT64_MAX
};

std::string scalar_text(const Ctx& c, const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) c.fail_at(n, key, "expected a scalar axis value, got " + type_name(n));
  return n.Scalar();
}

// A {grid: {family: F, AXIS: [values...]}} entry's axes, and their product (not expanded).
Grid parse_grid(const Ctx& c, const YAML::Node& m, const std::string& key) {
  check_keys(c, m, key, {"grid"});
  const YAML::Node g = m["grid"];
  const std::string gkey = key + ".grid";
  if (!g.IsDefined()) c.fail_at(m, gkey, "missing");
  require_map(c, g, gkey);
  if (!g["family"].IsDefined()) c.fail_at(g, gkey + ".family", "missing (e.g. kvarn)");
  Grid grid;
  grid.family = get_string(c, g["family"], gkey + ".family");
  for (auto it = g.begin(); it != g.end(); ++it) {
    const std::string k = key_text(c, it->first, gkey);
    if (k == "family") continue;
    const std::string akey = gkey + "." + k;
    std::vector<std::string> values;
    if (it->second.IsSequence()) {
      if (it->second.size() == 0) c.fail_at(it->second, akey, "empty grid axis");
      for (std::size_t j = 0; j < it->second.size(); ++j) {
        values.push_back(scalar_text(c, it->second[j], akey + "." + std::to_string(j)));
      }
    } else {
      values.push_back(scalar_text(c, it->second, akey));
    }
    if (__builtin_mul_overflow(grid.combinations, static_cast<std::int64_t>(values.size()),
                               &grid.combinations)) {
      grid.combinations = std::numeric_limits<std::int64_t>::max();
    }
    grid.axes.emplace_back(k, values);
  }
  return grid;
}

// Calls visit(spec) for every combination of the grid, last axis fastest.
template <typename Visit>
void for_each_combination(const Grid& grid, Visit&& visit) {
  std::vector<std::size_t> idx(grid.axes.size(), 0);
  while (true) {
    std::string spec = grid.family;
    for (std::size_t a = 0; a < grid.axes.size(); ++a) {
      spec += a == 0 ? ':' : ',';
      spec += grid.axes[a].first + "=" + grid.axes[a].second[idx[a]];
    }
    visit(spec);
    int a = static_cast<int>(grid.axes.size()) - 1;  // odometer increment
    for (; a >= 0; --a) {
      if (++idx[a] < grid.axes[a].second.size()) break;
      idx[a] = 0;
    }
    if (a < 0) break;
  }
}

// Builds the method for one entry and appends it as a case unless its canonical spec was seen.
void add_case(const Ctx& c, const MethodInput& in, std::set<std::string>& seen, SweepConfig& cfg) {
  std::unique_ptr<Method> m;
  try {
    m = make_method(in.text);
    for (const CaptureSpec& cap : cfg.data.captures) m->check_head_dim(cap.head_dim);
    for (const TilesSource& t : cfg.data.tiles) m->check_head_dim(t.head_dim);
  } catch (const Error& e) {
    c.fail_at(in.node, in.key, e.what());
  }
  const std::string spec = m->spec();
  if (!seen.insert(spec).second) return;
  CaseSpec cs;
  cs.index = static_cast<int>(cfg.cases.size());
  char id[32];
  std::snprintf(id, sizeof(id), "c%03d-", cs.index);
  cs.id = id + sha256_hex(spec).substr(0, 8);
  cs.input = in.text;
  cs.name = m->name();
  cs.spec = spec;
  cs.family = m->family();
  cs.bits_per_element =
      m->accounting(cfg.data.captures.empty() ? cfg.data.tiles.front().head_dim
                                              : cfg.data.captures.front().head_dim)
          .bits_per_element();
  cfg.cases.push_back(cs);
}

}  // namespace

void resolve_cases(const Ctx& c, const YAML::Node& methods, SweepConfig& cfg) {
  if (!methods.IsDefined() || methods.IsNull()) c.fail_at(methods, "methods", "missing");
  if (!methods.IsSequence())
    c.fail_at(methods, "methods", "expected a list, got " + type_name(methods));
  if (methods.size() == 0) c.fail_at(methods, "methods", "empty list of methods");
  // Pass 1: every entry checked and counted; nothing expanded.
  std::vector<std::optional<Grid>> grids;
  std::int64_t total = 0;
  for (std::size_t i = 0; i < methods.size(); ++i) {
    const std::string key = "methods." + std::to_string(i);
    const YAML::Node m = methods[i];
    if (m.IsScalar()) {
      grids.emplace_back();
      ++total;
    } else if (m.IsMap()) {
      grids.push_back(parse_grid(c, m, key));
      total = grids.back()->combinations > kMaxMethodCombinations
                  ? grids.back()->combinations
                  : total + grids.back()->combinations;
    } else {
      c.fail_at(m, key, "expected a method name/spec or {grid: {...}}, got " + type_name(m));
    }
    if (total > kMaxMethodCombinations) {
      c.fail_at(m, m.IsMap() ? key + ".grid" : key,
                "the methods expand to " + std::to_string(total) +
                    " combinations, above the limit of " + std::to_string(kMaxMethodCombinations) +
                    " (docs/config-schema.md, \"Limits\"): split the sweep into several configs");
    }
  }
  // Pass 2: one combination at a time, deduplicated on the canonical spec as it goes.
  std::set<std::string> seen;
  for (std::size_t i = 0; i < methods.size(); ++i) {
    const std::string key = "methods." + std::to_string(i);
    const YAML::Node m = methods[i];
    if (!grids[i]) {
      add_case(c, {m.Scalar(), m, key}, seen, cfg);
      continue;
    }
    for_each_combination(*grids[i], [&](const std::string& spec) {
      add_case(c, {spec, m["grid"], key + ".grid"}, seen, cfg);
    });
  }
}

}  // namespace kvarn::config_detail
