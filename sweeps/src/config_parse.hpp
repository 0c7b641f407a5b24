// Shared pieces of the sweep config parsers (config*.cpp): where a key lives for error messages,
// typed reads that name file:line:col and the key, and the section parsers load_config calls.
// Internal to kvarn_sweeps.
#ifndef KVARN_SWEEPS_SRC_CONFIG_PARSE_HPP_
#define KVARN_SWEEPS_SRC_CONFIG_PARSE_HPP_

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kvarn/sweeps/config.hpp"
#include "kvarn/sweeps/config_keys.hpp"

namespace kvarn::config_detail {

// Where a key lives, for error messages: file:line:col, or "(from --set)" for overridden keys.
class Ctx {
 public:
  Ctx(std::string file, std::set<std::string> overridden)
      : file_(std::move(file)), overridden_(std::move(overridden)) {}

  [[noreturn]] void fail_at(const YAML::Node& node, const std::string& key,
                            const std::string& msg) const;
  [[noreturn]] void fail_mark(const YAML::Mark& mark, const std::string& key,
                              const std::string& msg) const;
  const std::string& file() const { return file_; }

 private:
  bool from_set(const std::string& key) const;
  std::string file_;
  std::set<std::string> overridden_;
};

std::string join_key(const std::string& parent, const std::string& child);
std::string type_name(const YAML::Node& n);
bool present(const YAML::Node& n);  // defined and not null

void require_map(const Ctx& c, const YAML::Node& n, const std::string& key);
// The text of a mapping key of the mapping at `path`; a key that is a list or a mapping (YAML's
// "? " complex keys) is an error at its place.
std::string key_text(const Ctx& c, const YAML::Node& key, const std::string& path);
// Unknown keys of `map` (at `path`) against `allowed`, with the nearest valid one.
void check_keys(const Ctx& c, const YAML::Node& map, const std::string& path,
                const std::vector<std::string>& allowed);

std::string get_string(const Ctx& c, const YAML::Node& n, const std::string& key);
// An integer that fits [lo, hi]; anything else (a wider value included) is an error, never a wrap.
std::int64_t get_int(const Ctx& c, const YAML::Node& n, const std::string& key, std::int64_t lo,
                     std::int64_t hi);
double get_double(const Ctx& c, const YAML::Node& n, const std::string& key);
bool get_bool(const Ctx& c, const YAML::Node& n, const std::string& key);

// An integer key of the table (its range) read from map[spec.name] into `out` when present.
template <typename Int>
void read_int(const Ctx& c, const YAML::Node& map, const std::string& path, const ConfigKey& spec,
              Int& out) {
  const YAML::Node n = map[std::string(spec.name)];
  if (n.IsDefined())
    out =
        static_cast<Int>(get_int(c, n, join_key(path, std::string(spec.name)), spec.min, spec.max));
}

// "all" or a non-empty list of distinct indices in the key's range.
std::optional<std::vector<int>> get_selection(const Ctx& c, const YAML::Node& n,
                                              const std::string& key, const ConfigKey& spec);
void check_selection(const Ctx& c, const YAML::Node& n, const std::string& key,
                     const std::optional<std::vector<int>>& sel, int count, const std::string& file,
                     const std::string& what);

// A file the config names, read whole up to `limit` bytes (a larger file or an endless stream
// is refused with the limit in the message). Throws kvarn::Error naming the path.
std::string read_bounded(const std::filesystem::path& path, std::int64_t limit,
                         const std::string& what);

// config_checkpoint.cpp: the checkpoint directory at `node` (resolved against the config's
// folder): config.json present and readable by the runner, tokenizer.json present unless
// `tokenizer_use` is empty (it says what needs one), the weights' fingerprint and the name.
CheckpointRef read_checkpoint(const Ctx& c, const YAML::Node& node, const std::string& key,
                              const std::filesystem::path& config_path,
                              const std::string& tokenizer_use);

// Section parsers (one file each).
// config_capture.cpp: `data.capture` / `data.fallback.capture`. Returns false (spec partly
// filled) when the model is not on disk and reads as a hub id.
bool parse_capture(const Ctx& c, const YAML::Node& n, const std::string& key,
                   const std::filesystem::path& config_path, CaptureSpec& cap);
// config_data.cpp: the `data` block (and its fallback) into cfg.data, notices included.
void parse_data(const Ctx& c, const YAML::Node& root, const std::filesystem::path& config_path,
                SweepConfig& cfg);
// config_accumulation.cpp: `accumulation:` with enabled: true.
void parse_accumulation(const Ctx& c, const YAML::Node& acc,
                        const std::filesystem::path& config_path, SweepConfig& cfg);
nlohmann::json accumulation_json(const AccumulationSettings& a);
// config_quality.cpp: `quality:` with enabled: true.
void parse_quality(const Ctx& c, const YAML::Node& q, const std::filesystem::path& config_path,
                   SweepConfig& cfg);
nlohmann::json quality_json(const QualitySettings& s);
// config_retrieval.cpp: `retrieval:` with enabled: true.
void parse_retrieval(const Ctx& c, const YAML::Node& n, const std::filesystem::path& config_path,
                     SweepConfig& cfg);
nlohmann::json retrieval_json(const RetrievalSettings& r);
// config_methods.cpp: the case list (grids expanded within kMaxMethodCombinations,
// deduplicated on the canonical spec while expanding).
void resolve_cases(const Ctx& c, const YAML::Node& methods, SweepConfig& cfg);

}  // namespace kvarn::config_detail

#endif  // KVARN_SWEEPS_SRC_CONFIG_PARSE_HPP_
