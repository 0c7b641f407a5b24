#include "kvarn/core/registry.hpp"

#include <algorithm>
#include <sstream>

#include "families.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn {

std::string format_spec_number(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest(const std::string& word, const std::vector<std::string>& candidates,
                    std::size_t n) {
  std::vector<std::pair<std::size_t, std::string>> scored;
  for (const auto& c : candidates) scored.emplace_back(edit_distance(word, c), c);
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::string out;
  for (std::size_t i = 0; i < scored.size() && i < n; ++i) {
    if (i) out += ", ";
    out += scored[i].second;
  }
  return out;
}

Params::Params(std::string family, std::map<std::string, std::string> values)
    : family_(std::move(family)), values_(std::move(values)) {}

namespace {
template <typename T>
T parse_number(const std::string& family, const std::string& key, const std::string& text) {
  std::istringstream is(text);
  T v{};
  is >> v;
  KVARN_CHECK(!is.fail() && is.eof(), "method '", family, "': parameter ", key, "='", text,
              "' is not a valid ", std::is_integral_v<T> ? "integer" : "number");
  return v;
}
}  // namespace

int Params::get_int(const std::string& key, int fallback) {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  used_[key] = true;
  return parse_number<int>(family_, key, it->second);
}

double Params::get_double(const std::string& key, double fallback) {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  used_[key] = true;
  return parse_number<double>(family_, key, it->second);
}

std::string Params::get_string(const std::string& key, const std::string& fallback) {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  used_[key] = true;
  return it->second;
}

bool Params::get_bool(const std::string& key, bool fallback) {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  used_[key] = true;
  const std::string& v = it->second;
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  fail("method '", family_, "': parameter ", key, "='", v, "' is not a boolean (true/false)");
}

void Params::finish(const std::vector<std::string>& valid) const {
  for (const auto& [k, v] : values_) {
    if (!used_.count(k)) {
      fail("method '", family_, "': unknown parameter '", k, "' (nearest valid: ", nearest(k, valid),
           "; all: ", [&] {
             std::string s;
             for (const auto& x : valid) s += (s.empty() ? "" : ", ") + x;
             return s;
           }(), ")");
    }
  }
}

const Registry& Registry::instance() {
  static const Registry registry = [] {
    Registry r;
    register_fp16(r);
    register_fp8(r);
    register_kvarn(r);
    register_kivi(r);
    register_quarot(r);
    register_turboquant(r);
    return r;
  }();
  return registry;
}

void Registry::add_family(FamilyInfo info) { families_.push_back(std::move(info)); }

void Registry::add_preset(std::string name, std::string spec) {
  presets_.push_back({std::move(name), std::move(spec)});
}

void Registry::add_name_pattern(std::function<std::string(const std::string&)> to_spec) {
  patterns_.push_back(std::move(to_spec));
}

std::unique_ptr<Method> Registry::make(const std::string& text) const {
  KVARN_CHECK(!text.empty(), "empty method name");
  for (const auto& p : presets_) {
    if (p.name == text) return make(p.spec);
  }
  for (const auto& pat : patterns_) {
    std::string spec = pat(text);
    if (!spec.empty()) return make(spec);
  }
  const auto colon = text.find(':');
  const std::string family = text.substr(0, colon);
  const FamilyInfo* fam = nullptr;
  for (const auto& f : families_) {
    if (f.family == family) fam = &f;
  }
  if (!fam) {
    std::vector<std::string> names;
    for (const auto& p : presets_) names.push_back(p.name);
    for (const auto& f : families_) names.push_back(f.family + ":");
    fail("unknown method '", text, "' (nearest valid: ", nearest(text, names, 4),
         "; `kvarn-eval methods` lists all)");
  }
  std::map<std::string, std::string> values;
  if (colon != std::string::npos) {
    std::string rest = text.substr(colon + 1);
    std::stringstream ss(rest);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.empty()) continue;
      auto eq = item.find('=');
      KVARN_CHECK(eq != std::string::npos && eq > 0, "method '", text, "': parameter '", item,
                  "' is not key=value");
      std::string key = item.substr(0, eq);
      KVARN_CHECK(!values.count(key), "method '", text, "': parameter '", key, "' given twice");
      values[key] = item.substr(eq + 1);
    }
  }
  Params params(family, values);
  auto m = fam->factory(params);
  params.finish(fam->keys);
  return m;
}

}  // namespace kvarn
