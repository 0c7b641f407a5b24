// Run directory layout, atomic case records, summaries regenerated from cases/, shard merging.
#include "kvarn/sweeps/store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "kvarn/data/atomic_file.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/read_file.hpp"
#include "kvarn/sweeps/provenance.hpp"

namespace kvarn {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

std::string slurp(const fs::path& p) { return read_regular_file(p, "run-directory file"); }

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string cell_text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// A row's cell; null for an optional column the row's record predates (summary_column_optional).
json row_cell(const json& row, const std::string& column) {
  return row.contains(column) ? row.at(column) : json(nullptr);
}

void copy_atomically(const fs::path& from, const fs::path& to) {
  write_atomically(to, [&](const fs::path& tmp) {
    fs::copy_file(from, tmp, fs::copy_options::overwrite_existing);
  });
}

}  // namespace

const std::vector<std::string>& summary_columns() {
  static const std::vector<std::string> cols = {
      "case_id",        "method", "spec",    "family", "data", "bits_per_element",
      "effective_bits", "metric", "scope",   "layer",  "head", "value",
      "ci_lo",          "ci_hi",  "ci_units"};
  return cols;
}

bool summary_column_optional(const std::string& column) {
  return column == "effective_bits" || column == "ci_lo" || column == "ci_hi" ||
         column == "ci_units";
}

std::string resolved_hash(const json& resolved) { return sha256_hex(resolved.dump()); }

json parse_json_text(const std::string& text, const std::string& where) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    // e.byte is 1-based (0 for an empty input): the offset of the byte the parser stopped at.
    const std::string what = e.what();
    const auto detail = what.find(": ");
    fail(where, ": not valid JSON at ", line_column(text, e.byte > 0 ? e.byte - 1 : 0),
         detail == std::string::npos ? std::string() : what.substr(detail));
  } catch (const json::exception& e) {  // e.g. a number beyond double's range
    fail(where, ": not valid JSON: ", without_tag(e.what()));
  }
}

json read_json_file(const fs::path& path) { return parse_json_text(slurp(path), path.string()); }

std::vector<ResolvedCase> resolved_cases(const json& resolved, const std::string& where) {
  KVARN_CHECK(resolved.is_object(), where, ": a resolved config must be a JSON object");
  KVARN_CHECK(resolved.contains("cases") && resolved["cases"].is_array(), where,
              ": key 'cases' must be an array of {id, spec}");
  std::vector<ResolvedCase> out;
  std::set<std::string> seen;
  const json& cases = resolved["cases"];
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    for (const char* k : {"id", "spec"}) {
      KVARN_CHECK(c.is_object() && c.contains(k) && c[k].is_string(), where, ": cases[", i,
                  "]: key '", k, "' must be a string");
    }
    ResolvedCase rc{c["id"].get<std::string>(), c["spec"].get<std::string>()};
    // Ids name files under cases/ and arrays/: nothing that could leave those directories.
    KVARN_CHECK(!rc.id.empty() && rc.id.size() <= 200 &&
                    rc.id.find_first_of("/\\") == std::string::npos && rc.id != "." &&
                    rc.id != ".." && rc.id.find('\0') == std::string::npos,
                where, ": cases[", i, "]: 'id' is not a valid case id");
    KVARN_CHECK(seen.insert(rc.id).second, where, ": cases[", i, "]: duplicate id '", rc.id, "'");
    out.push_back(std::move(rc));
  }
  return out;
}

bool resolved_arrays(const json& resolved, const std::string& where) {
  KVARN_CHECK(
      resolved.is_object() && resolved.contains("metrics") && resolved["metrics"].is_object(),
      where, ": key 'metrics' must be an object");
  const json& m = resolved["metrics"];
  if (!m.contains("arrays")) return true;
  KVARN_CHECK(m["arrays"].is_boolean(), where, ": metrics.arrays must be true or false");
  return m["arrays"].get<bool>();
}

std::string case_record_problem(const json& j, const std::string& id, const std::string& spec) {
  if (!j.is_object()) return "not a JSON object";
  auto str = [&](const char* k) {
    return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string();
  };
  if (str("format") != kCaseFormat) {
    return std::string("key 'format' is not \"") + kCaseFormat + "\"";
  }
  if (!j.contains("format_version") || !j["format_version"].is_number_integer() ||
      j["format_version"].get<long long>() != kCaseFormatVersion) {
    return "key 'format_version' is not " + std::to_string(kCaseFormatVersion);
  }
  if (str("case_id") != id) return "key 'case_id' is not \"" + id + "\"";
  if (str("spec") != spec) return "key 'spec' is not \"" + spec + "\"";
  if (!j.contains("rows") || !j["rows"].is_array()) return "key 'rows' is not an array";
  const json& rows = j["rows"];
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].is_object()) return "rows[" + std::to_string(i) + "] is not an object";
    for (const std::string& c : summary_columns()) {
      if (!summary_column_optional(c) && !rows[i].contains(c))
        return "rows[" + std::to_string(i) + "] has no key '" + c + "'";
    }
    const json& v = rows[i]["value"];
    if (!v.is_number() && !(v.is_string() && (v == "nan" || v == "inf" || v == "-inf"))) {
      return "rows[" + std::to_string(i) + "].value is not a number";
    }
  }
  return "";
}

fs::path RunStore::case_path(const std::string& id) const {
  return dir_ / "cases" / (id + ".json");
}
fs::path RunStore::arrays_path(const std::string& id) const {
  return dir_ / "arrays" / (id + ".h5");
}

void RunStore::init(const json& resolved, const std::string& config_text) const {
  fs::create_directories(dir_ / "cases");
  fs::create_directories(dir_ / "arrays");
  fs::create_directories(dir_ / "provenance");
  const fs::path rp = dir_ / "resolved.json";
  if (fs::exists(rp)) {
    const json existing = read_json_file(rp);
    KVARN_CHECK(resolved_hash(existing) == resolved_hash(resolved), dir_.string(),
                ": holds a different resolved config (resolved.json hash ",
                resolved_hash(existing).substr(0, 12), ", this config ",
                resolved_hash(resolved).substr(0, 12), "); refusing to mix results");
  } else {
    write_text_atomically(rp, resolved.dump(2) + "\n");
  }
  // The config as first given; later resumes may differ only in keys outside the hash.
  if (!fs::exists(dir_ / "config.yaml")) write_text_atomically(dir_ / "config.yaml", config_text);
}

json RunStore::resolved() const { return read_json_file(dir_ / "resolved.json"); }

int RunStore::remove_stale_temporaries() const {
  int n = 0;
  if (!fs::exists(dir_)) return 0;
  for (const auto& e : fs::recursive_directory_iterator(dir_)) {
    if (e.is_regular_file() && e.path().filename().string().find(".tmp.") != std::string::npos) {
      std::error_code ec;
      if (fs::remove(e.path(), ec)) ++n;
    }
  }
  return n;
}

std::string RunStore::case_problem(const std::string& id, const std::string& spec,
                                   bool arrays) const {
  const fs::path p = case_path(id);
  std::error_code ec;
  if (!fs::exists(p, ec)) return "missing";
  json j;
  try {
    j = read_json_file(p);
  } catch (const Error& e) {
    return e.what();
  }
  std::string problem = case_record_problem(j, id, spec);
  if (!problem.empty()) return p.string() + ": " + problem;
  if (arrays && !fs::is_regular_file(arrays_path(id), ec)) {
    return arrays_path(id).string() + ": missing (the case record names it)";
  }
  return "";
}

bool RunStore::case_done(const std::string& id, const std::string& spec, bool arrays) const {
  return case_problem(id, spec, arrays).empty();
}

void RunStore::write_case(const json& record) const {
  write_text_atomically(case_path(record.at("case_id").get<std::string>()), record.dump(1) + "\n");
}

std::string summary_jsonl(const std::vector<json>& records) {
  std::string out;
  for (const json& r : records) {
    for (const json& row : r.at("rows")) {
      ordered_json o;
      for (const std::string& c : summary_columns()) o[c] = row_cell(row, c);
      out += o.dump() + "\n";
    }
  }
  return out;
}

std::string summary_csv(const std::vector<json>& records) {
  std::string out;
  for (std::size_t i = 0; i < summary_columns().size(); ++i) {
    if (i) out += ',';
    out += summary_columns()[i];
  }
  out += "\n";
  for (const json& r : records) {
    for (const json& row : r.at("rows")) {
      for (std::size_t i = 0; i < summary_columns().size(); ++i) {
        if (i) out += ',';
        out += csv_field(cell_text(row_cell(row, summary_columns()[i])));
      }
      out += "\n";
    }
  }
  return out;
}

int RunStore::write_summaries() const {
  const json res = resolved();
  const std::string where = (dir_ / "resolved.json").string();
  const bool arrays = resolved_arrays(res, where);
  std::vector<json> records;
  for (const ResolvedCase& c : resolved_cases(res, where)) {
    if (!case_done(c.id, c.spec, arrays)) continue;
    records.push_back(read_json_file(case_path(c.id)));
  }
  write_text_atomically(dir_ / "summary.jsonl", summary_jsonl(records));
  write_text_atomically(dir_ / "summary.csv", summary_csv(records));
  return static_cast<int>(records.size());
}

RunLock::RunLock(const fs::path& dir) : path_(dir / ".lock") {
  // The holder removes the file when done, so a finished run keeps no lock file. A process that
  // opened the file just before that removal may still win the flock on the removed inode: it
  // checks that its inode is still the one at the path and retries otherwise.
  for (int attempt = 0; attempt < 100; ++attempt) {
    fd_ = ::open(path_.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    KVARN_CHECK(fd_ >= 0, path_.string(), ": cannot open lock file: ", std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd_);
      fd_ = -1;
      fail(dir.string(), ": another kvarn-eval process is writing this run directory");
    }
    struct stat held = {};
    struct stat at_path = {};
    if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &at_path) == 0 &&
        held.st_dev == at_path.st_dev && held.st_ino == at_path.st_ino) {
      return;
    }
    ::close(fd_);
    fd_ = -1;
  }
  fail(path_.string(), ": the lock file keeps being replaced; another process is using the run");
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still holding the flock
  ::close(fd_);             // closing releases it
}

namespace {

// One shard, checked before anything is written: its resolved config and config text.
struct ShardInput {
  fs::path dir;
  json resolved;
  std::string config_text;
};

ShardInput read_shard(const fs::path& s) {
  KVARN_CHECK(fs::is_directory(s), s.string(), ": not a run directory");
  KVARN_CHECK(fs::is_regular_file(s / "resolved.json"), s.string(),
              ": not a run directory (no resolved.json)");
  ShardInput in{s, read_json_file(s / "resolved.json"), slurp(s / "config.yaml")};
  resolved_cases(in.resolved, (s / "resolved.json").string());
  resolved_arrays(in.resolved, (s / "resolved.json").string());
  return in;
}

// Copies the shards' finished cases (arrays first: the record marks the case finished) and
// provenance into `store`, which is locked by the caller.
void copy_shards(const RunStore& store, const std::vector<ShardInput>& shards) {
  const fs::path& out = store.dir();
  const bool arrays = resolved_arrays(shards.front().resolved, "resolved.json");
  const std::vector<ResolvedCase> cases = resolved_cases(shards.front().resolved, "resolved.json");
  for (const ShardInput& s : shards) {
    const RunStore src(s.dir);
    for (const ResolvedCase& c : cases) {
      if (store.case_done(c.id, c.spec, arrays)) continue;
      const std::string problem = src.case_problem(c.id, c.spec, arrays);
      if (problem == "missing") continue;  // another shard's case
      KVARN_CHECK(problem.empty(), problem);
      if (arrays) copy_atomically(src.arrays_path(c.id), store.arrays_path(c.id));
      copy_atomically(src.case_path(c.id), store.case_path(c.id));
    }
    if (fs::is_directory(s.dir / "provenance")) {
      for (const auto& e : fs::directory_iterator(s.dir / "provenance")) {
        const fs::path dst = out / "provenance" / e.path().filename();
        if (e.is_regular_file() && !fs::exists(dst)) copy_atomically(e.path(), dst);
      }
    }
    for (const char* f : {"provenance.json", "throughput.json"}) {
      if (fs::is_regular_file(s.dir / f) && !fs::exists(out / f)) {
        copy_atomically(s.dir / f, out / f);
      }
    }
  }
}

}  // namespace

std::pair<int, int> merge_runs(const fs::path& out, const std::vector<fs::path>& shards) {
  KVARN_CHECK(!shards.empty(), "merge: no shard directories given");
  std::vector<ShardInput> inputs;
  for (const fs::path& s : shards) {
    inputs.push_back(read_shard(s));
    const ShardInput& first = inputs.front();
    KVARN_CHECK(resolved_hash(inputs.back().resolved) == resolved_hash(first.resolved), s.string(),
                ": resolved config differs from ", first.dir.string(), " (hash ",
                resolved_hash(inputs.back().resolved).substr(0, 12), " vs ",
                resolved_hash(first.resolved).substr(0, 12),
                "): these are not shards of one sweep");
  }
  // A merge that fails into a directory it created removes it: nothing half-made is left.
  const bool created = !fs::exists(out);
  try {
    RunStore store(out);
    fs::create_directories(out);
    const int total =
        static_cast<int>(resolved_cases(inputs.front().resolved, "resolved.json").size());
    int done = 0;
    {
      RunLock lock(out);
      store.init(inputs.front().resolved, inputs.front().config_text);
      store.remove_stale_temporaries();
      copy_shards(store, inputs);
      done = store.write_summaries();
    }
    return {done, total};
  } catch (...) {
    std::error_code ec;
    if (created) fs::remove_all(out, ec);
    throw;
  }
}

}  // namespace kvarn
