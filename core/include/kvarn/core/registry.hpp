// One registry for every method: vLLM-style names (presets such as "kvarn_k4v2_g128",
// "turboquant_4bit_nc", "fp8_e4m3") and parameterized specs "family:key=value,key=value"
// (e.g. "kvarn:k=3,v=2,g=64,iters=16,rotation=none", "kivi:bits=2,group=32,residual=128").
// Unknown names, families or keys are errors that list the nearest valid ones.
#ifndef KVARN_CORE_REGISTRY_HPP_
#define KVARN_CORE_REGISTRY_HPP_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvarn/core/method.hpp"

namespace kvarn {

// Parameters of one spec; every key must be consumed (finish() rejects leftovers).
class Params {
 public:
  Params(std::string family, std::map<std::string, std::string> values);
  int get_int(const std::string& key, int fallback);
  double get_double(const std::string& key, double fallback);
  std::string get_string(const std::string& key, const std::string& fallback);
  bool get_bool(const std::string& key, bool fallback);
  bool has(const std::string& key) const { return values_.count(key) != 0; }
  // Throws if any key was not read, naming it and the nearest of `valid`.
  void finish(const std::vector<std::string>& valid) const;
  const std::string& family() const { return family_; }

 private:
  std::string family_;
  std::map<std::string, std::string> values_;
  mutable std::map<std::string, bool> used_;
};

using MethodFactory = std::function<std::unique_ptr<Method>(Params&)>;

struct FamilyInfo {
  std::string family;               // "kvarn"
  std::string summary;              // one line
  std::vector<std::string> keys;    // accepted parameter keys, documented in docs/methods.md
  MethodFactory factory;
};

struct PresetInfo {
  std::string name;  // "kvarn_k4v2_g128"
  std::string spec;  // "kvarn:k=4,v=2,g=128"
};

class Registry {
 public:
  static const Registry& instance();
  void add_family(FamilyInfo info);
  void add_preset(std::string name, std::string spec);
  // A pattern name handler (e.g. kvarn_k{b}v{b}_g{G}); returns a spec or "" when not matching.
  void add_name_pattern(std::function<std::string(const std::string&)> to_spec);

  std::unique_ptr<Method> make(const std::string& name_or_spec) const;
  const std::vector<PresetInfo>& presets() const { return presets_; }
  const std::vector<FamilyInfo>& families() const { return families_; }

 private:
  std::vector<FamilyInfo> families_;
  std::vector<PresetInfo> presets_;
  std::vector<std::function<std::string(const std::string&)>> patterns_;
};

inline std::unique_ptr<Method> make_method(const std::string& name_or_spec) {
  return Registry::instance().make(name_or_spec);
}

// A number as written in specs and names: shortest form that round-trips at 9 digits.
std::string format_spec_number(double v);

// Edit distance, for "did you mean" suggestions.
std::size_t edit_distance(const std::string& a, const std::string& b);
// Up to n candidates nearest to `word`, joined by ", ".
std::string nearest(const std::string& word, const std::vector<std::string>& candidates,
                    std::size_t n = 3);

}  // namespace kvarn

#endif  // KVARN_CORE_REGISTRY_HPP_
