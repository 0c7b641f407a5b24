// YAML sweep config: parse, override, validate with file:line:col errors, resolve the case list.
#include "kvarn/sweeps/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/tile_file.hpp"
#if KVARN_HAVE_RUNNER
#include "kvarn/eval/model.hpp"
#endif
#include "kvarn/sweeps/provenance.hpp"

namespace kvarn {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Cost model of estimate_sweep(), measured on the quickstart (one core of a 2020s x86 server,
// I/O included) and deliberately rough: seconds per token of one (layer, KV head) slab, and
// attention's cost per (query, key) pair per pass (1 + one per outlier level) at D = 128.
constexpr double kReconSecondsPerToken = 4.5e-5;
constexpr double kAttentionSecondsPerTokenPair = 2.0e-7;
constexpr double kCaseJsonBytesPerSlab = 20000;
constexpr double kArrayBytesPerToken = 175;
constexpr double kSummaryBytesPerSlab = 5000;
// Accumulation (model in the loop), per weight byte: a context token in blocks, a decode step.
constexpr double kAccumulationSecondsPerTokenByte = 1.0e-10;
constexpr double kAccumulationSecondsPerStepByte = 1.0e-9;

const std::vector<std::string> kTopKeys = {"version", "name",    "description",  "data",
                                           "methods", "metrics", "accumulation", "throughput",
                                           "seed",    "output",  "report"};
const std::vector<std::string> kDataKeys = {"tiles",      "sequences", "layers",  "kv_heads",
                                            "max_tokens", "capture",   "fallback"};
const std::vector<std::string> kFallbackKeys = {"tiles", "sequences", "layers", "kv_heads",
                                                "max_tokens"};
const std::vector<std::string> kCaptureKeys = {"model", "prompts", "generate"};
const std::vector<std::string> kAccumulationKeys = {
    "enabled", "model", "prompts",     "prompt_ids", "block",  "context", "decode_steps",
    "modes",   "seed",  "temperature", "top_p",      "device", "threads"};
const std::vector<std::string> kAccumulationModes = {"pseudo_decode", "teacher_forced",
                                                     "free_running"};
const std::vector<std::string> kMetricsKeys = {"reconstruction", "attention", "outlier_fractions",
                                               "topk", "arrays"};

// Where a key lives, for error messages.
class Ctx {
 public:
  Ctx(std::string file, std::set<std::string> overridden)
      : file_(std::move(file)), overridden_(std::move(overridden)) {}

  [[noreturn]] void fail_at(const YAML::Node& node, const std::string& key,
                            const std::string& msg) const {
    fail_mark(node.IsDefined() ? node.Mark() : YAML::Mark::null_mark(), key, msg);
  }
  [[noreturn]] void fail_mark(const YAML::Mark& mark, const std::string& key,
                              const std::string& msg) const {
    std::ostringstream os;
    if (from_set(key)) {
      os << file_ << ": key '" << key << "' (from --set): " << msg;
    } else if (!mark.is_null()) {
      os << file_ << ":" << mark.line + 1 << ":" << mark.column + 1 << ": key '" << key
         << "': " << msg;
    } else {
      os << file_ << ": key '" << key << "': " << msg;
    }
    throw Error(os.str());
  }
  const std::string& file() const { return file_; }

 private:
  bool from_set(const std::string& key) const {
    for (const std::string& p : overridden_) {
      if (key == p || key.rfind(p + ".", 0) == 0) return true;
    }
    return false;
  }
  std::string file_;
  std::set<std::string> overridden_;
};

std::string join_key(const std::string& parent, const std::string& child) {
  return parent.empty() ? child : parent + "." + child;
}

std::string type_name(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar:
      return "scalar '" + n.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "nothing";
  }
}

void require_map(const Ctx& c, const YAML::Node& n, const std::string& key) {
  if (!n.IsMap()) c.fail_at(n, key, "expected a mapping, got " + type_name(n));
}

void check_keys(const Ctx& c, const YAML::Node& map, const std::string& path,
                const std::vector<std::string>& allowed) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string k = it->first.as<std::string>();
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) {
      c.fail_mark(it->first.Mark(), join_key(path, k),
                  "unknown key (nearest: " + nearest(k, allowed, 1) + ")");
    }
  }
}

std::string get_string(const Ctx& c, const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) c.fail_at(n, key, "expected a string, got " + type_name(n));
  return n.Scalar();
}

long long get_int(const Ctx& c, const YAML::Node& n, const std::string& key) {
  if (n.IsScalar()) {
    try {
      return n.as<long long>();
    } catch (const YAML::BadConversion&) {
    }
  }
  c.fail_at(n, key, "expected an integer, got " + type_name(n));
}

double get_double(const Ctx& c, const YAML::Node& n, const std::string& key) {
  if (n.IsScalar()) {
    try {
      const double x = n.as<double>();
      if (std::isfinite(x)) return x;
    } catch (const YAML::BadConversion&) {
    }
  }
  c.fail_at(n, key, "expected a finite number, got " + type_name(n));
}

bool get_bool(const Ctx& c, const YAML::Node& n, const std::string& key) {
  if (n.IsScalar()) {
    try {
      return n.as<bool>();
    } catch (const YAML::BadConversion&) {
    }
  }
  c.fail_at(n, key, "expected true or false, got " + type_name(n));
}

// "all" or a non-empty list of distinct non-negative integers.
std::optional<std::vector<int>> get_selection(const Ctx& c, const YAML::Node& n,
                                              const std::string& key) {
  if (!n.IsDefined() || n.IsNull()) return std::nullopt;
  if (n.IsScalar() && n.Scalar() == "all") return std::nullopt;
  if (n.IsScalar()) {  // a single index is accepted as a one-element list
    return std::vector<int>{static_cast<int>(get_int(c, n, key))};
  }
  if (!n.IsSequence())
    c.fail_at(n, key, "expected 'all' or a list of indices, got " + type_name(n));
  if (n.size() == 0) c.fail_at(n, key, "empty selection (use 'all' or list indices)");
  std::vector<int> out;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const std::string k = key + "." + std::to_string(i);
    const long long x = get_int(c, n[i], k);
    if (x < 0) c.fail_at(n[i], k, "index must be >= 0, got " + std::to_string(x));
    if (std::find(out.begin(), out.end(), static_cast<int>(x)) != out.end()) {
      c.fail_at(n[i], k, "duplicate index " + std::to_string(x));
    }
    out.push_back(static_cast<int>(x));
  }
  return out;
}

json selection_json(const std::optional<std::vector<int>>& s) { return s ? json(*s) : json("all"); }

void check_selection(const Ctx& c, const YAML::Node& n, const std::string& key,
                     const std::optional<std::vector<int>>& sel, int count, const TilesSource& t,
                     const std::string& what) {
  if (!sel) return;
  for (std::size_t i = 0; i < sel->size(); ++i) {
    if ((*sel)[i] >= count) {
      c.fail_at(n.IsSequence() ? n[i] : n, key,
                "index " + std::to_string((*sel)[i]) + " out of range: " + t.path + " has " +
                    std::to_string(count) + " " + what);
    }
  }
}

// Parses tiles/sequences/layers/kv_heads/max_tokens of `data` or `data.fallback`.
DataSelection parse_selection(const Ctx& c, const YAML::Node& n, const std::string& path,
                              const fs::path& config_path) {
  DataSelection d;
  const std::string tkey = join_key(path, "tiles");
  const YAML::Node tiles = n["tiles"];
  if (!tiles.IsDefined() || tiles.IsNull()) c.fail_at(n, tkey, "missing (an HDF5 tile file)");
  std::vector<std::pair<YAML::Node, std::string>> entries;
  if (tiles.IsSequence()) {
    if (tiles.size() == 0) c.fail_at(tiles, tkey, "empty list of tile files");
    for (std::size_t i = 0; i < tiles.size(); ++i) {
      entries.emplace_back(tiles[i], tkey + "." + std::to_string(i));
    }
  } else {
    entries.emplace_back(tiles, tkey);
  }
  std::set<std::string> names;
  for (const auto& [node, key] : entries) {
    TilesSource t;
    t.path = get_string(c, node, key);
    t.resolved = resolve_input_path(t.path, config_path);
    if (t.resolved.empty()) {
      c.fail_at(node, key,
                "file not found: " + t.path +
                    " (looked in the current directory, the config's "
                    "directory and its parent)");
    }
    try {
      TileReader r(t.resolved);
      t.head_dim = r.info().head_dim;
    } catch (const Error& e) {
      c.fail_at(node, key, e.what());
    }
    t.fingerprint = file_fingerprint(t.resolved);
    t.name = fs::path(t.path).stem().string();
    for (int i = 2; names.count(t.name); ++i)
      t.name = fs::path(t.path).stem().string() + "_" + std::to_string(i);
    names.insert(t.name);
    d.tiles.push_back(t);
  }
  d.sequences = get_selection(c, n["sequences"], join_key(path, "sequences"));
  d.layers = get_selection(c, n["layers"], join_key(path, "layers"));
  d.kv_heads = get_selection(c, n["kv_heads"], join_key(path, "kv_heads"));
  if (n["max_tokens"].IsDefined()) {
    const long long m = get_int(c, n["max_tokens"], join_key(path, "max_tokens"));
    if (m < 0) c.fail_at(n["max_tokens"], join_key(path, "max_tokens"), "must be >= 0 (0: all)");
    d.max_tokens = static_cast<int>(m);
  }
  for (const TilesSource& t : d.tiles) {
    TileReader r(t.resolved);
    check_selection(c, n["sequences"], join_key(path, "sequences"), d.sequences, r.num_sequences(),
                    t, "sequences");
    check_selection(c, n["layers"], join_key(path, "layers"), d.layers,
                    r.info().num_captured_layers(), t, "captured layers");
    check_selection(c, n["kv_heads"], join_key(path, "kv_heads"), d.kv_heads, r.info().num_kv_heads,
                    t, "KV heads");
  }
  return d;
}

std::string scalar_text(const Ctx& c, const YAML::Node& n, const std::string& key) {
  if (!n.IsScalar()) c.fail_at(n, key, "expected a scalar axis value, got " + type_name(n));
  return n.Scalar();
}

struct MethodInput {
  std::string text;
  YAML::Node node;
  std::string key;
};

// Plain names and specs, and the cartesian product of every grid (last axis fastest).
std::vector<MethodInput> expand_methods(const Ctx& c, const YAML::Node& methods) {
  if (!methods.IsDefined() || methods.IsNull()) c.fail_at(methods, "methods", "missing");
  if (!methods.IsSequence())
    c.fail_at(methods, "methods", "expected a list, got " + type_name(methods));
  if (methods.size() == 0) c.fail_at(methods, "methods", "empty list of methods");
  std::vector<MethodInput> out;
  for (std::size_t i = 0; i < methods.size(); ++i) {
    const std::string key = "methods." + std::to_string(i);
    const YAML::Node m = methods[i];
    if (m.IsScalar()) {
      out.push_back({m.Scalar(), m, key});
      continue;
    }
    if (!m.IsMap())
      c.fail_at(m, key, "expected a method name/spec or {grid: {...}}, got " + type_name(m));
    check_keys(c, m, key, {"grid"});
    const YAML::Node g = m["grid"];
    const std::string gkey = key + ".grid";
    if (!g.IsDefined()) c.fail_at(m, gkey, "missing");
    require_map(c, g, gkey);
    if (!g["family"].IsDefined()) c.fail_at(g, gkey + ".family", "missing (e.g. kvarn)");
    const std::string family = get_string(c, g["family"], gkey + ".family");
    std::vector<std::pair<std::string, std::vector<std::string>>> axes;
    for (auto it = g.begin(); it != g.end(); ++it) {
      const std::string k = it->first.as<std::string>();
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
      axes.emplace_back(k, values);
    }
    std::vector<std::size_t> idx(axes.size(), 0);
    while (true) {
      std::string spec = family;
      for (std::size_t a = 0; a < axes.size(); ++a) {
        spec += a == 0 ? ':' : ',';
        spec += axes[a].first + "=" + axes[a].second[idx[a]];
      }
      out.push_back({spec, g, gkey});
      // Odometer increment, last axis fastest.
      int a = static_cast<int>(axes.size()) - 1;
      for (; a >= 0; --a) {
        if (++idx[a] < axes[a].second.size()) break;
        idx[a] = 0;
      }
      if (a < 0) break;
    }
  }
  return out;
}

void apply_set(YAML::Node node, const std::vector<std::string>& segs, std::size_t i,
               const YAML::Node& value, const std::string& text) {
  const std::string& seg = segs[i];
  const bool last = i + 1 == segs.size();
  const bool is_index = !seg.empty() && std::all_of(seg.begin(), seg.end(), ::isdigit);
  if (node.IsSequence()) {
    KVARN_CHECK(is_index, "--set ", text, ": '", seg, "' indexes a list and must be a number");
    const std::size_t idx = std::stoul(seg);
    KVARN_CHECK(idx < node.size() || (last && idx == node.size()), "--set ", text, ": index ", idx,
                " out of range (the list has ", node.size(), " entries)");
    if (last) {
      if (idx == node.size()) {
        node.push_back(value);
      } else {
        node[idx] = value;
      }
      return;
    }
    apply_set(node[idx], segs, i + 1, value, text);
    return;
  }
  KVARN_CHECK(node.IsMap() || node.IsNull() || !node.IsDefined(), "--set ", text, ": '", seg,
              "' is below a scalar");
  if (last) {
    node[seg] = value;
    return;
  }
  apply_set(node[seg], segs, i + 1, value, text);
}

// `accumulation:` with enabled: true. Files and the model's config are checked here, so a bad
// path or an unsupported checkpoint fails before anything runs.
void parse_accumulation(const Ctx& c, const YAML::Node& acc, const fs::path& config_path,
                        SweepConfig& cfg) {
  AccumulationSettings& a = cfg.accumulation;
#if !KVARN_HAVE_RUNNER
  // The main job must still run where torch was skipped: say so and go on without it.
  a = AccumulationSettings{};
  cfg.notices.push_back(cfg.name +
                        ": accumulation skipped: this kvarn-eval was built without the libtorch "
                        "model runner (scripts/install_deps.sh installs torch; rebuild)");
  (void)c;
  (void)acc;
  (void)config_path;
  return;
#else
  auto int_in = [&](const char* key, int lo, int hi, int& out) {
    const YAML::Node n = acc[key];
    if (!n.IsDefined()) return;
    const std::string k = std::string("accumulation.") + key;
    const long long v = get_int(c, n, k);
    if (v < lo || v > hi) {
      c.fail_at(n, k, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    out = static_cast<int>(v);
  };
  int_in("block", 1, 1 << 20, a.block);
  int_in("context", 1, 1 << 22, a.context);
  int_in("decode_steps", 1, 1 << 20, a.decode_steps);
  int_in("threads", 0, 1024, a.threads);
  if (acc["seed"].IsDefined()) {
    a.seed = get_int(c, acc["seed"], "accumulation.seed");
    if (a.seed < 0) c.fail_at(acc["seed"], "accumulation.seed", "must be >= 0");
  } else {
    a.seed = cfg.seed;
  }
  if (acc["temperature"].IsDefined()) {
    a.temperature = get_double(c, acc["temperature"], "accumulation.temperature");
    if (a.temperature < 0) {
      c.fail_at(acc["temperature"], "accumulation.temperature", "must be >= 0 (0: greedy only)");
    }
  }
  if (acc["top_p"].IsDefined()) {
    a.top_p = get_double(c, acc["top_p"], "accumulation.top_p");
    if (a.top_p <= 0 || a.top_p > 1)
      c.fail_at(acc["top_p"], "accumulation.top_p", "must be in (0, 1]");
  }
  if (acc["device"].IsDefined()) {
    a.device = get_string(c, acc["device"], "accumulation.device");
    const bool ok = a.device == "cpu" || a.device == "cuda" || a.device.rfind("cuda:", 0) == 0;
    if (!ok) c.fail_at(acc["device"], "accumulation.device", "expected cpu, cuda or cuda:N");
  }
  if (const YAML::Node m = acc["modes"]; m.IsDefined()) {
    if (!m.IsSequence() || m.size() == 0) {
      c.fail_at(m, "accumulation.modes",
                "expected a non-empty list of pseudo_decode, "
                "teacher_forced, free_running");
    }
    a.pseudo_decode = a.teacher_forced = a.free_running = false;
    for (std::size_t i = 0; i < m.size(); ++i) {
      const std::string k = "accumulation.modes." + std::to_string(i);
      const std::string v = get_string(c, m[i], k);
      if (v == "pseudo_decode") {
        a.pseudo_decode = true;
      } else if (v == "teacher_forced") {
        a.teacher_forced = true;
      } else if (v == "free_running") {
        a.free_running = true;
      } else {
        c.fail_at(m[i], k,
                  "unknown mode '" + v + "' (nearest: " + nearest(v, kAccumulationModes, 1) + ")");
      }
    }
  }

  // Models: one path or a list; each a checkpoint directory the runner can load.
  const YAML::Node mn = acc["model"];
  if (!mn.IsDefined() || mn.IsNull()) {
    c.fail_at(acc, "accumulation.model", "missing: a checkpoint directory (or a list of them)");
  }
  std::vector<std::pair<YAML::Node, std::string>> models;
  if (mn.IsSequence()) {
    if (mn.size() == 0) c.fail_at(mn, "accumulation.model", "empty list");
    for (std::size_t i = 0; i < mn.size(); ++i)
      models.emplace_back(mn[i], "accumulation.model." + std::to_string(i));
  } else {
    models.emplace_back(mn, "accumulation.model");
  }
  std::set<std::string> names;
  for (const auto& [node, key] : models) {
    AccumulationModel am;
    am.path = get_string(c, node, key);
    am.resolved = resolve_input_path(am.path, config_path);
    std::error_code ec;
    if (am.resolved.empty() || !fs::is_regular_file(am.resolved / "config.json", ec)) {
      c.fail_at(node, key,
                "not a checkpoint directory (config.json not found): " + am.path +
                    (am.path.find("smollm2") != std::string::npos
                         ? " (scripts/prepare_models.sh prepares it)"
                         : ""));
    }
    if (!fs::is_regular_file(am.resolved / "tokenizer.json", ec)) {
      c.fail_at(node, key, am.path + " has no tokenizer.json (prompts are text)");
    }
    try {
      const ModelConfig mc = load_model_config(am.resolved / "config.json");
      am.head_dim = mc.head_dim;
      am.num_layers = mc.num_layers;
      if (a.context + a.decode_steps > mc.max_position_embeddings) {
        c.fail_at(acc["context"].IsDefined() ? acc["context"] : node, "accumulation.context",
                  "context + decode_steps = " + std::to_string(a.context + a.decode_steps) +
                      " exceeds " + am.path + "'s max_position_embeddings " +
                      std::to_string(mc.max_position_embeddings));
      }
    } catch (const Error& e) {
      c.fail_at(node, key, e.what());
    }
    const fs::path weights = fs::is_regular_file(am.resolved / "model.safetensors", ec)
                                 ? am.resolved / "model.safetensors"
                                 : am.resolved / "config.json";
    am.fingerprint = file_fingerprint(weights);
    for (const auto& e : fs::directory_iterator(am.resolved, ec)) {
      if (e.path().extension() == ".safetensors")
        am.weight_bytes += static_cast<double>(e.file_size(ec));
    }
    am.name = am.resolved.filename().string();
    if (am.name.empty()) am.name = am.resolved.parent_path().filename().string();
    if (!names.insert(am.name).second) c.fail_at(node, key, "model listed twice: " + am.name);
    a.models.push_back(std::move(am));
  }

  // Prompts: JSONL with {"id", "text"} per line.
  const YAML::Node pn = acc["prompts"];
  if (!pn.IsDefined() || pn.IsNull()) {
    c.fail_at(acc, "accumulation.prompts", "missing: a JSONL file of {\"id\", \"text\"}");
  }
  a.prompts = get_string(c, pn, "accumulation.prompts");
  a.prompts_resolved = resolve_input_path(a.prompts, config_path);
  if (a.prompts_resolved.empty())
    c.fail_at(pn, "accumulation.prompts", "file not found: " + a.prompts);
  std::vector<std::pair<std::string, std::string>> file_prompts;
  {
    std::ifstream in(a.prompts_resolved);
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const json j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j.contains("text") ||
          !j["id"].is_string() || !j["text"].is_string()) {
        c.fail_at(pn, "accumulation.prompts",
                  a.prompts + ":" + std::to_string(lineno) +
                      ": expected a JSON object with string fields id and text");
      }
      file_prompts.emplace_back(j["id"].get<std::string>(), j["text"].get<std::string>());
    }
  }
  if (file_prompts.empty()) c.fail_at(pn, "accumulation.prompts", a.prompts + " holds no prompts");
  std::vector<std::string> ids;
  for (const auto& fp : file_prompts) ids.push_back(fp.first);
  if (const YAML::Node pi = acc["prompt_ids"]; pi.IsDefined() && !pi.IsNull()) {
    if (!pi.IsSequence() || pi.size() == 0) {
      c.fail_at(pi, "accumulation.prompt_ids", "expected a non-empty list of prompt ids");
    }
    for (std::size_t i = 0; i < pi.size(); ++i) {
      const std::string k = "accumulation.prompt_ids." + std::to_string(i);
      const std::string id = get_string(c, pi[i], k);
      auto it = std::find(ids.begin(), ids.end(), id);
      if (it == ids.end()) {
        c.fail_at(
            pi[i], k,
            "no prompt '" + id + "' in " + a.prompts + " (nearest: " + nearest(id, ids, 1) + ")");
      }
      if (std::find(a.prompt_ids.begin(), a.prompt_ids.end(), id) != a.prompt_ids.end()) {
        c.fail_at(pi[i], k, "prompt '" + id + "' listed twice");
      }
      a.prompt_ids.push_back(id);
      a.prompt_texts.push_back(file_prompts[static_cast<std::size_t>(it - ids.begin())].second);
    }
  } else {
    a.prompt_ids.push_back(file_prompts.front().first);
    a.prompt_texts.push_back(file_prompts.front().second);
  }
#endif
}

// The resolved `accumulation` block; disabled configs keep the exact form older runs hashed.
json accumulation_json(const AccumulationSettings& a) {
  if (!a.enabled) return {{"enabled", false}};
  json models = json::array();
  for (const AccumulationModel& m : a.models) {
    models.push_back({{"path", m.path}, {"name", m.name}, {"fingerprint", m.fingerprint}});
  }
  std::vector<std::string> modes;
  if (a.pseudo_decode) modes.push_back("pseudo_decode");
  if (a.teacher_forced) modes.push_back("teacher_forced");
  if (a.free_running) modes.push_back("free_running");
  return {{"enabled", true},
          {"models", models},
          {"prompts", a.prompts},
          {"prompts_fingerprint", file_fingerprint(a.prompts_resolved)},
          {"prompt_ids", a.prompt_ids},
          {"block", a.block},
          {"context", a.context},
          {"decode_steps", a.decode_steps},
          {"modes", modes},
          {"temperature", a.temperature},
          {"top_p", a.top_p},
          {"seed", a.seed},
          {"device", a.device}};
}

}  // namespace

fs::path resolve_input_path(const std::string& path, const fs::path& config_path) {
  const fs::path p(path);
  std::error_code ec;
  if (p.is_absolute()) return fs::exists(p, ec) ? p : fs::path();
  const fs::path dir = config_path.parent_path();
  for (const fs::path& base :
       {fs::current_path(), dir, dir.empty() ? fs::path("..") : dir.parent_path()}) {
    const fs::path cand = base.empty() ? p : base / p;
    if (fs::exists(cand, ec)) return cand;
  }
  return {};
}

SweepConfig load_config(const fs::path& path, const std::vector<std::string>& sets) {
  SweepConfig cfg;
  cfg.config_path = path;
  cfg.sets = sets;
  {
    std::ifstream in(path, std::ios::binary);
    KVARN_CHECK(in.good(), path.string(), ": cannot open config");
    std::stringstream ss;
    ss << in.rdbuf();
    cfg.config_text = ss.str();
  }
  YAML::Node root;
  try {
    root = YAML::Load(cfg.config_text);
  } catch (const YAML::ParserException& e) {
    fail(path.string(), ":", e.mark.line + 1, ":", e.mark.column + 1,
         ": YAML syntax error: ", e.msg);
  }
  std::set<std::string> overridden;
  for (const std::string& s : sets) {
    const auto eq = s.find('=');
    KVARN_CHECK(eq != std::string::npos && eq > 0, "--set ", s, ": expected key.path=value");
    const std::string key = s.substr(0, eq);
    YAML::Node value;
    try {
      value = YAML::Load(s.substr(eq + 1));
    } catch (const YAML::ParserException& e) {
      fail("--set ", s, ": value is not valid YAML: ", e.msg);
    }
    std::vector<std::string> segs;
    std::stringstream ks(key);
    for (std::string seg; std::getline(ks, seg, '.');) {
      KVARN_CHECK(!seg.empty(), "--set ", s, ": empty key segment");
      segs.push_back(seg);
    }
    if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
    apply_set(root, segs, 0, value, s);
    overridden.insert(key);
  }
  const Ctx c(path.string(), overridden);
  if (!root.IsMap())
    c.fail_at(root, "(root)", "expected a mapping of config keys, got " + type_name(root));
  check_keys(c, root, "", kTopKeys);

  if (!root["version"].IsDefined()) c.fail_at(root, "version", "missing (schema version, 1)");
  cfg.version = static_cast<int>(get_int(c, root["version"], "version"));
  if (cfg.version != kConfigSchemaVersion) {
    c.fail_at(
        root["version"], "version",
        "unsupported schema version " + std::to_string(cfg.version) + " (this build reads 1)");
  }
  if (!root["name"].IsDefined()) c.fail_at(root, "name", "missing");
  cfg.name = get_string(c, root["name"], "name");
  if (cfg.name.empty() || !std::all_of(cfg.name.begin(), cfg.name.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.';
      })) {
    c.fail_at(root["name"], "name",
              "must be non-empty and use only letters, digits, '_', '-', '.'");
  }
  if (root["description"].IsDefined() && !root["description"].IsNull()) {
    cfg.description = get_string(c, root["description"], "description");
  }

  // data: tiles, or a capture spec that falls back to embedded tiles while capture is missing.
  const YAML::Node data = root["data"];
  if (!data.IsDefined()) c.fail_at(root, "data", "missing");
  require_map(c, data, "data");
  check_keys(c, data, "data", kDataKeys);
  const YAML::Node capture = data["capture"];
  if (capture.IsDefined() && !capture.IsNull()) {
    require_map(c, capture, "data.capture");
    check_keys(c, capture, "data.capture", kCaptureKeys);
    if (capture["model"].IsDefined()) get_string(c, capture["model"], "data.capture.model");
    if (capture["prompts"].IsDefined()) get_string(c, capture["prompts"], "data.capture.prompts");
    if (capture["generate"].IsDefined()) get_int(c, capture["generate"], "data.capture.generate");
  }
  const YAML::Node fallback = data["fallback"];
  if (fallback.IsDefined() && !fallback.IsNull()) {
    require_map(c, fallback, "data.fallback");
    check_keys(c, fallback, "data.fallback", kFallbackKeys);
  }
  const bool has_tiles = data["tiles"].IsDefined() && !data["tiles"].IsNull();
  const bool has_capture = capture.IsDefined() && !capture.IsNull();
  if (has_tiles) {
    cfg.data = parse_selection(c, data, "data", path);
    if (has_capture) {
      cfg.notices.push_back(cfg.name + ": data.tiles is given, so data.capture is not run (the " +
                            "capture is taken to be the tiles file)");
    }
  } else if (has_capture) {
    if (!fallback.IsDefined() || fallback.IsNull()) {
      c.fail_at(capture, "data.capture",
                "data.capture needs `kvarn-eval capture` (not yet available); run it separately "
                "and point data.tiles at its output");
    }
    cfg.data = parse_selection(c, fallback, "data.fallback", path);
    cfg.data.source = "fallback";
    cfg.notices.push_back(cfg.name +
                          ": capture not available / model not supplied — running on the "
                          "embedded tiles at reduced size (data.fallback: " +
                          cfg.data.tiles.front().path + ")");
  } else {
    c.fail_at(data, "data.tiles", "missing (an HDF5 tile file, or a data.capture block)");
  }

  // metrics
  const YAML::Node metrics = root["metrics"];
  if (metrics.IsDefined() && !metrics.IsNull()) {
    require_map(c, metrics, "metrics");
    check_keys(c, metrics, "metrics", kMetricsKeys);
    MetricsSelection& m = cfg.metrics;
    if (metrics["reconstruction"].IsDefined()) {
      m.reconstruction = get_bool(c, metrics["reconstruction"], "metrics.reconstruction");
    }
    if (metrics["attention"].IsDefined()) {
      m.attention = get_bool(c, metrics["attention"], "metrics.attention");
    }
    if (metrics["arrays"].IsDefined()) m.arrays = get_bool(c, metrics["arrays"], "metrics.arrays");
    const YAML::Node of = metrics["outlier_fractions"];
    if (of.IsDefined()) {
      m.outlier_percents.clear();
      if (!of.IsNull()) {
        if (!of.IsSequence())
          c.fail_at(of, "metrics.outlier_fractions", "expected a list of percents");
        for (std::size_t i = 0; i < of.size(); ++i) {
          const std::string k = "metrics.outlier_fractions." + std::to_string(i);
          const double p = get_double(c, of[i], k);
          if (p <= 0 || p > 100) c.fail_at(of[i], k, "percent must be in (0, 100]");
          m.outlier_percents.push_back(p);
        }
      }
    }
    const YAML::Node tk = metrics["topk"];
    if (tk.IsDefined()) {
      if (!tk.IsSequence() || tk.size() == 0)
        c.fail_at(tk, "metrics.topk", "expected a non-empty list of integers");
      m.topk.clear();
      for (std::size_t i = 0; i < tk.size(); ++i) {
        const std::string k = "metrics.topk." + std::to_string(i);
        const long long v = get_int(c, tk[i], k);
        if (v < 1) c.fail_at(tk[i], k, "must be >= 1");
        m.topk.push_back(static_cast<int>(v));
      }
    }
    if (!m.reconstruction && !m.attention) {
      c.fail_at(metrics, "metrics",
                "both reconstruction and attention are off: nothing to measure");
    }
  }

  const YAML::Node acc = root["accumulation"];
  if (acc.IsDefined() && !acc.IsNull()) {
    require_map(c, acc, "accumulation");
    check_keys(c, acc, "accumulation", kAccumulationKeys);
    if (acc["enabled"].IsDefined()) {
      cfg.accumulation.enabled = get_bool(c, acc["enabled"], "accumulation.enabled");
    }
    if (cfg.accumulation.enabled) parse_accumulation(c, acc, path, cfg);
  }
  const YAML::Node tp = root["throughput"];
  if (tp.IsDefined() && !tp.IsNull()) {
    require_map(c, tp, "throughput");
    check_keys(c, tp, "throughput", {"results"});
    if (tp["results"].IsDefined() && !tp["results"].IsNull()) {
      cfg.throughput_results = get_string(c, tp["results"], "throughput.results");
      cfg.throughput_resolved = resolve_input_path(cfg.throughput_results, path);
      if (cfg.throughput_resolved.empty()) {
        c.fail_at(tp["results"], "throughput.results",
                  "file not found: " + cfg.throughput_results +
                      " (GPU benchmark JSON, e.g. bench/results/*.json)");
      }
      std::ifstream in(cfg.throughput_resolved);
      std::stringstream ss;
      ss << in.rdbuf();
      if (json::parse(ss.str(), nullptr, false).is_discarded()) {
        c.fail_at(tp["results"], "throughput.results",
                  cfg.throughput_results + " is not valid JSON");
      }
    }
  }
  if (root["seed"].IsDefined()) {
    cfg.seed = get_int(c, root["seed"], "seed");
    if (cfg.seed < 0) c.fail_at(root["seed"], "seed", "must be >= 0");
  }
  if (root["output"].IsDefined()) {
    cfg.output = get_string(c, root["output"], "output");
    if (cfg.output.empty()) c.fail_at(root["output"], "output", "must not be empty");
  }
  if (root["report"].IsDefined()) cfg.report = get_bool(c, root["report"], "report");

  // Cases: resolve every name/spec through the registry, deduplicate on the canonical spec.
  std::set<std::string> seen;
  for (const MethodInput& in : expand_methods(c, root["methods"])) {
    std::unique_ptr<Method> m;
    try {
      m = make_method(in.text);
      for (const TilesSource& t : cfg.data.tiles) m->check_head_dim(t.head_dim);
    } catch (const Error& e) {
      c.fail_at(in.node, in.key, e.what());
    }
    const std::string spec = m->spec();
    if (!seen.insert(spec).second) continue;
    CaseSpec cs;
    cs.index = static_cast<int>(cfg.cases.size());
    char id[32];
    std::snprintf(id, sizeof(id), "c%03d-", cs.index);
    cs.id = id + sha256_hex(spec).substr(0, 8);
    cs.input = in.text;
    cs.name = m->name();
    cs.spec = spec;
    cs.family = m->family();
    cs.bits_per_element = m->accounting(cfg.data.tiles.front().head_dim).bits_per_element();
    cfg.cases.push_back(cs);
  }

  // Queries: attention needs them; a capture without q skips attention with a notice.
  if (cfg.metrics.attention) {
    for (const TilesSource& t : cfg.data.tiles) {
      TileReader r(t.resolved);
      bool any_q = false;
      for (int s = 0; s < r.num_sequences(); ++s) any_q = any_q || r.sequence(s).has_q;
      if (!any_q) {
        cfg.notices.push_back("warning: " + t.path +
                              " has no captured queries: attention metrics are skipped for it");
      }
    }
  }

  json tiles = json::array();
  for (const TilesSource& t : cfg.data.tiles) {
    tiles.push_back({{"path", t.path},
                     {"name", t.name},
                     {"fingerprint", t.fingerprint},
                     {"head_dim", t.head_dim}});
  }
  json cases = json::array();
  for (const CaseSpec& cs : cfg.cases) {
    cases.push_back({{"index", cs.index},
                     {"id", cs.id},
                     {"input", cs.input},
                     {"name", cs.name},
                     {"spec", cs.spec},
                     {"family", cs.family},
                     {"bits_per_element", cs.bits_per_element}});
  }
  // What determines results, and nothing else (no output path, no report flag): its hash names
  // the run directory, so moving the output or re-running elsewhere resumes the same run.
  cfg.resolved = {
      {"schema_version", kConfigSchemaVersion},
      {"name", cfg.name},
      {"data",
       {{"source", cfg.data.source},
        {"tiles", tiles},
        {"sequences", selection_json(cfg.data.sequences)},
        {"layers", selection_json(cfg.data.layers)},
        {"kv_heads", selection_json(cfg.data.kv_heads)},
        {"max_tokens", cfg.data.max_tokens}}},
      {"cases", cases},
      {"metrics",
       {{"reconstruction", cfg.metrics.reconstruction},
        {"attention", cfg.metrics.attention},
        {"outlier_percents", cfg.metrics.outlier_percents},
        {"topk", cfg.metrics.topk},
        {"arrays", cfg.metrics.arrays}}},
      {"accumulation", accumulation_json(cfg.accumulation)},
      {"throughput",
       {{"results", cfg.throughput_results.empty() ? json(nullptr) : json(cfg.throughput_results)},
        {"fingerprint", cfg.throughput_results.empty()
                            ? json(nullptr)
                            : json(file_fingerprint(cfg.throughput_resolved))}}},
      {"seed", cfg.seed}};
  cfg.hash = sha256_hex(cfg.resolved.dump());
  return cfg;
}

SweepEstimate estimate_sweep(const SweepConfig& cfg) {
  SweepEstimate e;
  double per_case_seconds = 0, per_case_bytes = 0;
  for (const TilesSource& t : cfg.data.tiles) {
    TileReader r(t.resolved);
    const int layers = cfg.data.layers ? static_cast<int>(cfg.data.layers->size())
                                       : r.info().num_captured_layers();
    const int heads =
        cfg.data.kv_heads ? static_cast<int>(cfg.data.kv_heads->size()) : r.info().num_kv_heads;
    std::vector<int> seqs;
    if (cfg.data.sequences) {
      seqs = *cfg.data.sequences;
    } else {
      for (int s = 0; s < r.num_sequences(); ++s) seqs.push_back(s);
    }
    for (int s : seqs) {
      const SequenceInfo& si = r.sequence(s);
      double tok = si.num_tokens;
      if (cfg.data.max_tokens > 0) tok = std::min<double>(tok, cfg.data.max_tokens);
      const double slabs = static_cast<double>(layers) * heads;
      // Captured query heads per KV head (captures may hold a subset of the model's).
      const double q_per_kv =
          static_cast<double>(si.q_heads.size()) / std::max(1, r.info().num_kv_heads);
      e.slabs += static_cast<std::int64_t>(slabs);
      e.tokens += static_cast<std::int64_t>(slabs * tok);
      if (cfg.metrics.reconstruction) per_case_seconds += slabs * tok * kReconSecondsPerToken;
      if (cfg.metrics.attention && si.has_q) {
        const double passes = 1.0 + static_cast<double>(cfg.metrics.outlier_percents.size());
        per_case_seconds += slabs * q_per_kv * passes * tok * tok * kAttentionSecondsPerTokenPair *
                            (t.head_dim / 128.0);
      }
      per_case_bytes += slabs * (kCaseJsonBytesPerSlab + kSummaryBytesPerSlab);
      if (cfg.metrics.arrays) per_case_bytes += slabs * tok * kArrayBytesPerToken;
    }
  }
  const AccumulationSettings& a = cfg.accumulation;
  if (a.enabled) {
    // Per model: four passes over the context (accumulated, static, two free runs) and three
    // decode runs, each cost ~ weights; the fp16 reference once per model (not per case).
    for (const AccumulationModel& m : a.models) {
      const double passes = (a.pseudo_decode ? 2.0 : 0.0) + (a.free_running ? 2.0 : 0.0) + 1.0;
      const double steps = (a.teacher_forced ? 1.0 : 0.0) + (a.free_running ? 2.0 : 0.0);
      per_case_seconds += static_cast<double>(a.prompt_ids.size()) * m.weight_bytes *
                          (passes * a.context * kAccumulationSecondsPerTokenByte +
                           steps * a.decode_steps * kAccumulationSecondsPerStepByte);
    }
  }
  e.seconds = per_case_seconds * static_cast<double>(cfg.cases.size());
  e.bytes = per_case_bytes * static_cast<double>(cfg.cases.size());
  return e;
}

}  // namespace kvarn
