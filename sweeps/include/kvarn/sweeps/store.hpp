// The result store of a sweep (docs/results.md): one run directory per resolved config, holding
//   config.yaml  resolved.json  provenance.json  provenance/<digest>.json  [shard.json]
//   cases/<case_id>.json  arrays/<case_id>.h5  summary.jsonl  summary.csv  [throughput.json]
// Every file is written atomically (temporary sibling + rename). A case is finished exactly when
// cases/<case_id>.json exists and validates; summaries are regenerated from cases/ in case order,
// so they are always consistent with it and identical for identical results.
#ifndef KVARN_SWEEPS_STORE_HPP_
#define KVARN_SWEEPS_STORE_HPP_

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvarn {

inline constexpr const char* kCaseFormat = "kvarn-sweep-case";
inline constexpr int kCaseFormatVersion = 1;
inline constexpr const char* kArraysFormat = "kvarn-sweep-arrays";
inline constexpr int kArraysFormatVersion = 1;

// Columns of summary.jsonl / summary.csv, in order.
const std::vector<std::string>& summary_columns();
// True for a column that case records written before it existed lack (effective_bits): such a
// row is still valid and its cell is null.
bool summary_column_optional(const std::string& column);

// Hash identifying a resolved config (sha256 of its canonical dump).
std::string resolved_hash(const nlohmann::json& resolved);
// Parses JSON text; a syntax error throws kvarn::Error naming `where` and the line and column.
nlohmann::json parse_json_text(const std::string& text, const std::string& where);
// read_regular_file + parse_json_text.
nlohmann::json read_json_file(const std::filesystem::path& path);

// The cases of a resolved config (resolved.json), checked: `cases` is an array of objects with
// string `id` (a valid file name, unique) and `spec`; errors name `where` and the index.
struct ResolvedCase {
  std::string id, spec;
};
std::vector<ResolvedCase> resolved_cases(const nlohmann::json& resolved, const std::string& where);
// metrics.arrays of a resolved config (default true), checked.
bool resolved_arrays(const nlohmann::json& resolved, const std::string& where);
// Empty when `record` is a complete case record of case `id` with `spec` (format, version, id,
// spec, rows with every summary column and a numeric value); else what is wrong, naming the key.
std::string case_record_problem(const nlohmann::json& record, const std::string& id,
                                const std::string& spec);

class RunStore {
 public:
  explicit RunStore(std::filesystem::path dir) : dir_(std::move(dir)) {}
  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path case_path(const std::string& id) const;
  std::filesystem::path arrays_path(const std::string& id) const;

  // Creates the layout, or checks that an existing run holds the same resolved config.
  void init(const nlohmann::json& resolved, const std::string& config_text) const;
  nlohmann::json resolved() const;
  // Removes temporaries of interrupted writes (call while holding the run lock). Returns count.
  int remove_stale_temporaries() const;
  // True when the case's record exists, parses, names this id and spec and its arrays exist.
  bool case_done(const std::string& id, const std::string& spec, bool arrays) const;
  // Why the case is not done: "missing" (no record), or the file and what is wrong with it;
  // empty when it is done.
  std::string case_problem(const std::string& id, const std::string& spec, bool arrays) const;
  void write_case(const nlohmann::json& record) const;
  // Regenerates summary.jsonl and summary.csv from every finished case, in case order.
  // Returns the number of finished cases.
  int write_summaries() const;

 private:
  std::filesystem::path dir_;
};

// Exclusive advisory lock on a run directory (flock on DIR/.lock; released on exit, also on
// SIGKILL). The file is removed when the lock is released normally.
class RunLock {
 public:
  explicit RunLock(const std::filesystem::path& dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

// Summary text of finished case records (in the order given).
std::string summary_jsonl(const std::vector<nlohmann::json>& records);
std::string summary_csv(const std::vector<nlohmann::json>& records);

// Combines shard run directories into `out` (created, or an existing run of the same config):
// copies finished cases and arrays, then regenerates the summaries. Throws when the shards hold
// different resolved configs. Returns {finished cases, total cases}.
std::pair<int, int> merge_runs(const std::filesystem::path& out,
                               const std::vector<std::filesystem::path>& shards);

}  // namespace kvarn

#endif  // KVARN_SWEEPS_STORE_HPP_
