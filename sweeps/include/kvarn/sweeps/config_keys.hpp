// The sweep config's keys as data: one row per key (section, name, type, integer range, default,
// one doc line). The section parsers read their keys through this table (unknown keys, integer
// ranges), and a test checks that docs/config-schema.md documents exactly these keys.
#ifndef KVARN_SWEEPS_CONFIG_KEYS_HPP_
#define KVARN_SWEEPS_CONFIG_KEYS_HPP_

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvarn {

enum class KeyType {
  kInt,         // one integer in [min, max]
  kNumber,      // a finite number (range checked by its parser: some bounds are open)
  kBool,        // true / false
  kString,      // one string
  kStrings,     // a string or a list of strings
  kStringList,  // a list of strings
  kIntList,     // a list of integers, each in [min, max]
  kNumberList,  // a list of numbers
  kSelection,   // `all` or a list of indices, each in [min, max]
  kIndexList,   // `all`, an index, a list of indices (each in [min, max]) or text like `0-3`
  kMapping,     // a nested section
  kList,        // the methods list
};

inline constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();
inline constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

struct ConfigKey {
  std::string_view section;  // "" (top level), "data", "data.capture", "metrics", ...
  std::string_view name;
  KeyType type;
  std::int64_t min = 0, max = 0;  // integer keys and integer list elements: the accepted range
  std::string_view default_text;  // as documented ("required" for required keys)
  std::string_view doc;

  std::string path() const {
    return section.empty() ? std::string(name) : std::string(section) + "." + std::string(name);
  }
};

// Every key of every section, in documentation order. `data.fallback` takes the `data` keys
// except `fallback`, and its `capture` the `data.capture` keys.
std::span<const ConfigKey> config_keys();

// The row of section.name; throws kvarn::Error when there is none (a programming error).
const ConfigKey& config_key(std::string_view section, std::string_view name);

// The key names of one section, in table order.
std::vector<std::string> config_section_keys(std::string_view section);

// Upper bounds on what a config may make the loader hold (docs/config-schema.md, "Limits").
inline constexpr std::int64_t kMaxConfigBytes = 4 << 20;        // the YAML file itself
inline constexpr std::int64_t kMaxConfigInputBytes = 64 << 20;  // JSON/JSONL files it names
inline constexpr std::int64_t kMaxMethodCombinations = 100000;  // method entries after grids

}  // namespace kvarn

#endif  // KVARN_SWEEPS_CONFIG_KEYS_HPP_
