// Run directory layout, atomic case records, summaries regenerated from cases/, shard merging.
#include "kvarn/sweeps/store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "kvarn/data/atomic_file.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/provenance.hpp"

namespace kvarn {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  KVARN_CHECK(in.good(), p.string(), ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

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

// A row's cell; null for a column the row's record predates (effective_bits in older runs).
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
      "case_id",        "method", "spec",  "family", "data", "bits_per_element",
      "effective_bits", "metric", "scope", "layer",  "head", "value"};
  return cols;
}

std::string resolved_hash(const json& resolved) { return sha256_hex(resolved.dump()); }

json read_json_file(const fs::path& path) {
  const std::string text = slurp(path);
  json j = json::parse(text, nullptr, false);
  KVARN_CHECK(!j.is_discarded(), path.string(), ": not valid JSON");
  return j;
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

bool RunStore::case_done(const std::string& id, const std::string& spec, bool arrays) const {
  const fs::path p = case_path(id);
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return false;
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  if (j.value("format", "") != kCaseFormat || j.value("format_version", 0) != kCaseFormatVersion) {
    return false;
  }
  if (j.value("case_id", "") != id || j.value("spec", "") != spec) return false;
  if (!j.contains("rows") || !j["rows"].is_array()) return false;
  if (arrays && !fs::is_regular_file(arrays_path(id), ec)) return false;
  return true;
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
  const bool arrays = res.at("metrics").value("arrays", true);
  std::vector<json> records;
  for (const json& c : res.at("cases")) {
    const std::string id = c.at("id"), spec = c.at("spec");
    if (!case_done(id, spec, arrays)) continue;
    records.push_back(read_json_file(case_path(id)));
  }
  write_text_atomically(dir_ / "summary.jsonl", summary_jsonl(records));
  write_text_atomically(dir_ / "summary.csv", summary_csv(records));
  return static_cast<int>(records.size());
}

RunLock::RunLock(const fs::path& dir) {
  const fs::path p = dir / ".lock";
  fd_ = ::open(p.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  KVARN_CHECK(fd_ >= 0, p.string(), ": cannot open lock file: ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd_);
    fd_ = -1;
    fail(dir.string(), ": another kvarn-eval process is writing this run directory");
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

std::pair<int, int> merge_runs(const fs::path& out, const std::vector<fs::path>& shards) {
  KVARN_CHECK(!shards.empty(), "merge: no shard directories given");
  json resolved;
  fs::path config_from;
  for (const fs::path& s : shards) {
    KVARN_CHECK(fs::is_regular_file(s / "resolved.json"), s.string(),
                ": not a run directory (no resolved.json)");
    const json r = read_json_file(s / "resolved.json");
    if (resolved.is_null()) {
      resolved = r;
      config_from = s;
    } else {
      KVARN_CHECK(resolved_hash(r) == resolved_hash(resolved), s.string(),
                  ": resolved config differs from ", config_from.string(), " (hash ",
                  resolved_hash(r).substr(0, 12), " vs ", resolved_hash(resolved).substr(0, 12),
                  "): these are not shards of one sweep");
    }
  }
  RunStore store(out);
  fs::create_directories(out);
  RunLock lock(out);
  store.init(resolved, slurp(config_from / "config.yaml"));
  store.remove_stale_temporaries();
  const bool arrays = resolved.at("metrics").value("arrays", true);
  for (const fs::path& s : shards) {
    const RunStore src(s);
    for (const json& c : resolved.at("cases")) {
      const std::string id = c.at("id"), spec = c.at("spec");
      if (store.case_done(id, spec, arrays) || !src.case_done(id, spec, arrays)) continue;
      // Arrays first: the case record is what marks the case finished.
      if (arrays) copy_atomically(src.arrays_path(id), store.arrays_path(id));
      copy_atomically(src.case_path(id), store.case_path(id));
    }
    if (fs::is_directory(s / "provenance")) {
      for (const auto& e : fs::directory_iterator(s / "provenance")) {
        const fs::path dst = out / "provenance" / e.path().filename();
        if (e.is_regular_file() && !fs::exists(dst)) copy_atomically(e.path(), dst);
      }
    }
    for (const char* f : {"provenance.json", "throughput.json"}) {
      if (fs::is_regular_file(s / f) && !fs::exists(out / f)) copy_atomically(s / f, out / f);
    }
  }
  const int done = store.write_summaries();
  return {done, static_cast<int>(resolved.at("cases").size())};
}

}  // namespace kvarn
