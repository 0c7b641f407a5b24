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
#include "kvarn/eval/attention.hpp"
#if KVARN_HAVE_RUNNER
#include "kvarn/eval/capture.hpp"
#include "kvarn/eval/model.hpp"
#include "kvarn/eval/tokenizer.hpp"
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
const std::vector<std::string> kFallbackKeys = {"tiles",    "sequences",  "layers",
                                                "kv_heads", "max_tokens", "capture"};
const std::vector<std::string> kCaptureKeys = {
    "model",  "prompts",  "prompt_ids",  "generate", "ignore_eos", "max_tokens",
    "layers", "kv_heads", "query_heads", "chat",     "device",     "threads"};
const std::vector<std::string> kAccumulationKeys = {
    "enabled", "model", "prompts",     "prompt_ids", "block",  "context", "decode_steps",
    "modes",   "seed",  "temperature", "top_p",      "device", "threads", "current_token"};
const std::vector<std::string> kAccumulationModes = {"pseudo_decode", "teacher_forced",
                                                     "free_running"};
const std::vector<std::string> kMetricsKeys = {"reconstruction", "attention", "outlier_fractions",
                                               "topk",           "arrays",    "device"};

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
                     const std::optional<std::vector<int>>& sel, int count, const std::string& file,
                     const std::string& what) {
  if (!sel) return;
  for (std::size_t i = 0; i < sel->size(); ++i) {
    if ((*sel)[i] >= count) {
      c.fail_at(n.IsSequence() ? n[i] : n, key,
                "index " + std::to_string((*sel)[i]) + " out of range: " + file + " has " +
                    std::to_string(count) + " " + what);
    }
  }
}

// A capture block's model that is not on disk and reads as a model hub id ("Qwen/Qwen3-8B",
// "gpt2"), not as a path: such a model selects data.fallback instead of failing.
bool looks_like_hub_id(const std::string& m) {
  if (m.empty() || m[0] == '/' || m[0] == '.' || m[0] == '~') return false;
  if (std::count(m.begin(), m.end(), '/') > 1) return false;
  return std::all_of(m.begin(), m.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.' ||
           ch == '/';
  });
}

// An index list of the capture: "all", "0-3", "0,3,7", a single index or a YAML list of indices
// (the text the capture library parses).
std::string index_list_text(const Ctx& c, const YAML::Node& n, const std::string& key) {
  if (n.IsScalar()) return n.Scalar();
  if (!n.IsSequence() || n.size() == 0) {
    c.fail_at(n, key,
              "expected 'all', a list of indices or a range such as 0-3, got " + type_name(n));
  }
  std::string out;
  for (std::size_t i = 0; i < n.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(get_int(c, n[i], key + "." + std::to_string(i)));
  }
  return out;
}

// `data.capture` / `data.fallback.capture`: keys and types always; with the runner, everything
// the capture will read (checkpoint config, prompts, index lists, context length). Returns false
// (spec only partly filled) when the model is not on disk and reads as a hub id.
bool parse_capture(const Ctx& c, const YAML::Node& n, const std::string& key,
                   const fs::path& config_path, CaptureSpec& cap) {
  require_map(c, n, key);
  check_keys(c, n, key, kCaptureKeys);
  cap.key = key;
  const std::string mkey = key + ".model", pkey = key + ".prompts";
  if (!n["model"].IsDefined() || n["model"].IsNull()) {
    c.fail_at(n, mkey, "missing (a checkpoint directory with config.json, or a hub id)");
  }
  cap.model = get_string(c, n["model"], mkey);
  if (!n["prompts"].IsDefined() || n["prompts"].IsNull()) {
    c.fail_at(n, pkey, "missing (a JSONL file of {\"id\", \"text\"} or {\"id\", \"token_ids\"})");
  }
  cap.prompts = get_string(c, n["prompts"], pkey);
  auto int_in = [&](const char* k, int lo, int hi, int& out) {
    const YAML::Node v = n[k];
    if (!v.IsDefined()) return;
    const long long x = get_int(c, v, key + "." + k);
    if (x < lo || x > hi) {
      c.fail_at(v, key + "." + k,
                "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    out = static_cast<int>(x);
  };
  int_in("generate", 0, 1 << 22, cap.generate);
  int_in("max_tokens", 0, 1 << 24, cap.max_tokens);
  int_in("threads", 0, 1024, cap.threads);
  if (n["ignore_eos"].IsDefined())
    cap.ignore_eos = get_bool(c, n["ignore_eos"], key + ".ignore_eos");
  if (n["chat"].IsDefined()) cap.chat = get_bool(c, n["chat"], key + ".chat");
  if (n["device"].IsDefined()) {
    cap.device = get_string(c, n["device"], key + ".device");
    const bool ok =
        cap.device == "cpu" || cap.device == "cuda" || cap.device.rfind("cuda:", 0) == 0;
    if (!ok) c.fail_at(n["device"], key + ".device", "expected cpu, cuda or cuda:N");
  }
  for (auto [k, out] : {std::pair<const char*, std::string*>{"layers", &cap.layers},
                        {"kv_heads", &cap.kv_heads},
                        {"query_heads", &cap.query_heads}}) {
    if (n[k].IsDefined()) *out = index_list_text(c, n[k], key + "." + k);
  }
  const YAML::Node ids = n["prompt_ids"];
  if (ids.IsDefined() && !ids.IsNull()) {
    if (!ids.IsSequence() || ids.size() == 0) {
      c.fail_at(ids, key + ".prompt_ids", "expected a non-empty list of prompt ids");
    }
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::string k = key + ".prompt_ids." + std::to_string(i);
      const std::string id = get_string(c, ids[i], k);
      if (std::find(cap.prompt_ids.begin(), cap.prompt_ids.end(), id) != cap.prompt_ids.end()) {
        c.fail_at(ids[i], k, "prompt '" + id + "' listed twice");
      }
      cap.prompt_ids.push_back(id);
    }
  }

  cap.model_resolved = resolve_input_path(cap.model, config_path);
  if (cap.model_resolved.empty()) {
    if (looks_like_hub_id(cap.model)) return false;
    c.fail_at(n["model"], mkey,
              "checkpoint directory not found: " + cap.model +
                  " (looked in the current directory, the config's directory and its parent)");
  }
  std::error_code ec;
  if (!fs::is_regular_file(cap.model_resolved / "config.json", ec)) {
    c.fail_at(n["model"], mkey, "not a checkpoint directory (config.json not found): " + cap.model);
  }
  cap.name = fs::absolute(cap.model_resolved).lexically_normal().filename().string();
  if (cap.name.empty()) cap.name = "capture";
#if KVARN_HAVE_RUNNER
  cap.prompts_resolved = resolve_input_path(cap.prompts, config_path);
  if (cap.prompts_resolved.empty()) c.fail_at(n["prompts"], pkey, "file not found: " + cap.prompts);
  std::vector<CapturePrompt> prompts;
  try {
    prompts = load_capture_prompts(cap.prompts_resolved);
  } catch (const Error& e) {
    c.fail_at(n["prompts"], pkey, e.what());
  }
  if (prompts.empty()) c.fail_at(n["prompts"], pkey, cap.prompts + " holds no prompts");
  if (!cap.prompt_ids.empty()) {
    std::vector<std::string> known;
    for (const CapturePrompt& p : prompts) known.push_back(p.id);
    std::vector<CapturePrompt> chosen;
    for (std::size_t i = 0; i < cap.prompt_ids.size(); ++i) {
      const std::string& id = cap.prompt_ids[i];
      const auto it = std::find(known.begin(), known.end(), id);
      if (it == known.end()) {
        c.fail_at(ids[i], key + ".prompt_ids." + std::to_string(i),
                  "no prompt '" + id + "' in " + cap.prompts +
                      " (nearest: " + nearest(id, known, 1) + ")");
      }
      chosen.push_back(prompts[static_cast<std::size_t>(it - known.begin())]);
    }
    prompts = std::move(chosen);
  }
  ModelConfig mc;
  try {
    mc = load_model_config(cap.model_resolved / "config.json");
  } catch (const Error& e) {
    c.fail_at(n["model"], mkey, e.what());
  }
  cap.head_dim = mc.head_dim;
  cap.num_layers = mc.num_layers;
  cap.num_kv_heads = mc.num_kv_heads;
  cap.num_q_heads = mc.num_heads;
  auto indices = [&](const char* k, const std::string& text, int count) {
    const std::string what = key + "." + k;
    try {
      return parse_index_list(text, count, what);
    } catch (const Error& e) {
      std::string msg = e.what();  // "<what>: ...": the key is named once, by fail_at
      if (msg.rfind(what + ": ", 0) == 0) msg = msg.substr(what.size() + 2);
      c.fail_at(n[k], what, msg);
    }
  };
  cap.captured_layers = static_cast<int>(indices("layers", cap.layers, mc.num_layers).size());
  if (static_cast<int>(indices("kv_heads", cap.kv_heads, mc.num_kv_heads).size()) !=
      mc.num_kv_heads) {
    c.fail_at(n["kv_heads"], key + ".kv_heads",
              "schema kvarn-tiles v1 stores every KV head; use 'all' (the model has " +
                  std::to_string(mc.num_kv_heads) + ")");
  }
  cap.captured_q_heads =
      static_cast<int>(indices("query_heads", cap.query_heads, mc.num_heads).size());

  // Token counts (the estimate, and the context check before anything runs).
  const bool any_text = std::any_of(prompts.begin(), prompts.end(),
                                    [](const CapturePrompt& p) { return !p.has_token_ids; });
  std::unique_ptr<Tokenizer> tok;
  if (any_text) {
    if (!fs::is_regular_file(cap.model_resolved / "tokenizer.json", ec)) {
      c.fail_at(n["model"], mkey, cap.model + " has no tokenizer.json (the prompts are text)");
    }
    if (Tokenizer::available()) {
      try {
        tok = Tokenizer::load(cap.model_resolved / "tokenizer.json");
      } catch (const Error& e) {
        c.fail_at(n["model"], mkey, e.what());
      }
    }
  }
  for (const CapturePrompt& p : prompts) {
    long long t = static_cast<long long>(p.token_ids.size());
    if (!p.has_token_ids) {
      try {
        t = tok ? static_cast<long long>(
                      encode_capture_prompt(*tok, cap.model_resolved, p.text, cap.chat).size())
                : static_cast<long long>(p.text.size() / 4 + 1);  // rough, estimate only
      } catch (const Error& e) {
        c.fail_at(
            n[cap.chat ? "chat" : "prompts"], cap.chat ? key + ".chat" : pkey,
            cap.prompts + ":" + std::to_string(p.line) + ": prompt '" + p.id + "': " + e.what());
      }
    }
    long long total = t + cap.generate;
    if (cap.max_tokens > 0) total = std::min<long long>(total, cap.max_tokens);
    if (total > mc.max_position_embeddings) {
      // The culprit: a max_tokens above the context, else generate, else the prompt itself.
      const char* k = cap.max_tokens > 0 ? "max_tokens" : cap.generate > 0 ? "generate" : "prompts";
      c.fail_at(n[k], key + "." + k,
                "prompt '" + p.id + "': " + std::to_string(t) + " prompt tokens + " +
                    std::to_string(cap.generate) + " generated exceed " + cap.model +
                    "'s context of " + std::to_string(mc.max_position_embeddings) +
                    " tokens (lower generate or set max_tokens)");
    }
    cap.sequence_tokens.push_back(static_cast<int>(total));
  }

  // Fingerprints of what determines the captured values.
  json files = json::object();
  for (const auto& e : fs::directory_iterator(cap.model_resolved, ec)) {
    const std::string f = e.path().filename().string();
    const bool weights = e.path().extension() == ".safetensors";
    if (weights) cap.weight_bytes += static_cast<double>(e.file_size(ec));
    if (weights || f == "config.json" || f == "tokenizer.json" || f == "tokenizer_config.json") {
      files[f] = file_fingerprint(e.path());
    }
  }
  cap.resolved = {{"model", cap.model},
                  {"name", cap.name},
                  {"model_files", files},
                  {"prompts", cap.prompts},
                  {"prompts_fingerprint", file_fingerprint(cap.prompts_resolved)},
                  {"prompt_ids", cap.prompt_ids},
                  {"generate", cap.generate},
                  {"ignore_eos", cap.ignore_eos},
                  {"max_tokens", cap.max_tokens},
                  {"layers", cap.layers},
                  {"kv_heads", cap.kv_heads},
                  {"query_heads", cap.query_heads},
                  {"chat", cap.chat},
                  {"device", cap.device}};
  cap.hash = sha256_hex(cap.resolved.dump());
#endif
  return true;
}

// Parses tiles/sequences/layers/kv_heads/max_tokens of `data` or `data.fallback`. The tiles may
// be absent when `capture` is given; the selection then applies to the captured file too.
DataSelection parse_selection(const Ctx& c, const YAML::Node& n, const std::string& path,
                              const fs::path& config_path,
                              const std::optional<CaptureSpec>& capture) {
  DataSelection d;
  d.capture = capture;
  const std::string tkey = join_key(path, "tiles");
  const YAML::Node tiles = n["tiles"];
  const bool no_tiles = !tiles.IsDefined() || tiles.IsNull();
  if (no_tiles && !capture) c.fail_at(n, tkey, "missing (an HDF5 tile file, or a capture block)");
  std::vector<std::pair<YAML::Node, std::string>> entries;
  if (no_tiles) {
  } else if (tiles.IsSequence()) {
    if (tiles.size() == 0) c.fail_at(tiles, tkey, "empty list of tile files");
    for (std::size_t i = 0; i < tiles.size(); ++i) {
      entries.emplace_back(tiles[i], tkey + "." + std::to_string(i));
    }
  } else {
    entries.emplace_back(tiles, tkey);
  }
  std::set<std::string> names;
  if (capture) names.insert(capture->name);
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
  auto check_all = [&](const std::string& file, int sequences, int layers, int kv_heads) {
    check_selection(c, n["sequences"], join_key(path, "sequences"), d.sequences, sequences, file,
                    "sequences");
    check_selection(c, n["layers"], join_key(path, "layers"), d.layers, layers, file,
                    "captured layers");
    check_selection(c, n["kv_heads"], join_key(path, "kv_heads"), d.kv_heads, kv_heads, file,
                    "KV heads");
  };
  if (capture) {
    check_all("the capture of " + capture->key, static_cast<int>(capture->sequence_tokens.size()),
              capture->captured_layers, capture->num_kv_heads);
  }
  for (const TilesSource& t : d.tiles) {
    TileReader r(t.resolved);
    check_all(t.path, r.num_sequences(), r.info().num_captured_layers(), r.info().num_kv_heads);
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

  // Current-token policy: one of exact / quantized, or a list of both (each a separate run).
  if (const YAML::Node ct = acc["current_token"]; ct.IsDefined()) {
    a.current_token.clear();
    const bool list = ct.IsSequence();
    if (list && ct.size() == 0) c.fail_at(ct, "accumulation.current_token", "empty list");
    for (std::size_t i = 0; i < (list ? ct.size() : 1); ++i) {
      const YAML::Node n = list ? ct[i] : ct;
      std::string k = "accumulation.current_token";
      if (list) k += "." + std::to_string(i);
      const std::string v = get_string(c, n, k);
      if (v != "exact" && v != "quantized") c.fail_at(n, k, "expected exact or quantized");
      if (std::find(a.current_token.begin(), a.current_token.end(), v) != a.current_token.end())
        c.fail_at(n, k, "'" + v + "' given twice");
      a.current_token.push_back(v);
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
      am.vocab_size = mc.vocab_size;
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
  // {id, text} or {id, token_ids} (token ids run where the build has no tokenizer).
  struct FilePrompt {
    std::string id, text;
    std::vector<std::int32_t> token_ids;
  };
  std::vector<FilePrompt> file_prompts;
  {
    std::ifstream in(a.prompts_resolved);
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const json j = json::parse(line, nullptr, false);
      const bool text = j.is_object() && j.contains("text") && j["text"].is_string();
      bool ids_ok = j.is_object() && j.contains("token_ids") && j["token_ids"].is_array() &&
                    !j["token_ids"].empty();
      FilePrompt fp;
      for (std::size_t i = 0; ids_ok && i < j["token_ids"].size(); ++i) {
        const json& t = j["token_ids"][i];
        ids_ok = t.is_number_integer() && t.get<long long>() >= 0 && t.get<long long>() < (1 << 30);
        if (ids_ok) fp.token_ids.push_back(static_cast<std::int32_t>(t.get<long long>()));
      }
      if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j["id"].is_string() ||
          text == ids_ok) {
        c.fail_at(pn, "accumulation.prompts",
                  a.prompts + ":" + std::to_string(lineno) +
                      ": expected a JSON object with a string id and either a string text or "
                      "token_ids (a non-empty list of non-negative integers)");
      }
      fp.id = j["id"].get<std::string>();
      if (text) fp.text = j["text"].get<std::string>();
      file_prompts.push_back(std::move(fp));
    }
  }
  if (file_prompts.empty()) c.fail_at(pn, "accumulation.prompts", a.prompts + " holds no prompts");
  std::vector<std::string> ids;
  for (const auto& fp : file_prompts) ids.push_back(fp.id);
  auto select = [&](std::size_t i) {
    const FilePrompt& fp = file_prompts[i];
    a.prompt_ids.push_back(fp.id);
    a.prompt_texts.push_back(fp.text);
    a.prompt_token_ids.push_back(fp.token_ids);
    for (const AccumulationModel& m : a.models) {
      for (const std::int32_t t : fp.token_ids) {
        if (t >= m.vocab_size) {
          c.fail_at(pn, "accumulation.prompts",
                    "prompt '" + fp.id + "': token id " + std::to_string(t) + " >= " + m.name +
                        "'s vocab_size " + std::to_string(m.vocab_size));
        }
      }
    }
  };
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
      select(static_cast<std::size_t>(it - ids.begin()));
    }
  } else {
    select(0);
  }
#endif
}

// One data block (`data` or `data.fallback`) into cfg.data. Returns false, with *remote set to the
// model, when its capture names a model that is not on disk (a hub id).
bool parse_data_block(const Ctx& c, const YAML::Node& n, const std::string& path,
                      const fs::path& config_path, SweepConfig& cfg, std::string* remote) {
  const YAML::Node cn = n["capture"];
  const bool has_tiles = n["tiles"].IsDefined() && !n["tiles"].IsNull();
  std::optional<CaptureSpec> capture;
  if (cn.IsDefined() && !cn.IsNull()) {
    const std::string key = join_key(path, "capture");
    CaptureSpec cap;
    if (!parse_capture(c, cn, key, config_path, cap)) {
      *remote = cap.model;
      return false;
    }
#if KVARN_HAVE_RUNNER
    capture = std::move(cap);
#else
    // A fallback with tiles still runs (as accumulation does); anything else would measure
    // something other than what the config asks for.
    if (path != "data" && has_tiles) {
      cfg.notices.push_back(cfg.name + ": " + key +
                            " skipped: this kvarn-eval was built without the libtorch model "
                            "runner; running on " +
                            join_key(path, "tiles") + " only");
    } else {
      c.fail_at(cn, key,
                "capturing from " + cap.model +
                    " needs the libtorch model runner, and this kvarn-eval was built without it "
                    "(scripts/install_deps.sh installs torch; rebuild), or capture elsewhere and "
                    "point " +
                    join_key(path, "tiles") + " at the file");
    }
#endif
  } else if (!has_tiles) {
    c.fail_at(n, join_key(path, "tiles"), "missing (an HDF5 tile file, or a capture block)");
  }
  cfg.data = parse_selection(c, n, path, config_path, capture);
  return true;
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
  json out = {{"enabled", true},
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
  // Recorded (and hashed) only when not the default, so older runs keep their hash.
  if (a.current_token != std::vector<std::string>{"exact"}) out["current_token"] = a.current_token;
  return out;
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

  // data: tiles and/or a capture spec; a capture whose model is not on disk (a hub id) selects
  // data.fallback, with a notice saying so.
  const YAML::Node data = root["data"];
  if (!data.IsDefined()) c.fail_at(root, "data", "missing");
  require_map(c, data, "data");
  check_keys(c, data, "data", kDataKeys);
  const YAML::Node fallback = data["fallback"];
  const bool has_fallback = fallback.IsDefined() && !fallback.IsNull();
  if (has_fallback) {
    require_map(c, fallback, "data.fallback");
    check_keys(c, fallback, "data.fallback", kFallbackKeys);
  }
  std::string remote;
  if (parse_data_block(c, data, "data", path, cfg, &remote)) {
    cfg.data.source = cfg.data.capture ? "capture" : "tiles";
  } else {
    if (!has_fallback) {
      c.fail_at(data["capture"]["model"], "data.capture.model",
                "'" + remote +
                    "' is not a local checkpoint directory (no config.json found) and there is "
                    "no data.fallback: download the model and pass its directory, e.g. --set "
                    "data.capture.model=/path/to/checkpoint");
    }
    std::string fb_remote;
    if (!parse_data_block(c, fallback, "data.fallback", path, cfg, &fb_remote)) {
      c.fail_at(fallback["capture"]["model"], "data.fallback.capture.model",
                "'" + fb_remote +
                    "' is not a local checkpoint directory: a fallback must run on local data");
    }
    cfg.data.source = "fallback";
    std::string what;
    if (const auto& cap = cfg.data.capture) {
      what = "a capture from " + cap->model + " (" + std::to_string(cap->sequence_tokens.size()) +
             " prompt(s) of " + cap->prompts + ", " + std::to_string(cap->generate) +
             " generated tokens)";
    }
    for (const TilesSource& t : cfg.data.tiles) what += (what.empty() ? "" : " + ") + t.path;
    cfg.notices.push_back(
        cfg.name + ": data.capture.model '" + remote +
        "' is not a local checkpoint, so data.fallback runs instead, at REDUCED SIZE (not the "
        "configured workload): " +
        what +
        ". To run the configured workload, supply the model: --set "
        "data.capture.model=/path/to/checkpoint");
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
    if (metrics["device"].IsDefined()) {
      m.device = get_string(c, metrics["device"], "metrics.device");
      if (m.device != "cpu" && m.device != "cuda")
        c.fail_at(metrics["device"], "metrics.device", "expected cpu or cuda");
      if (m.device == "cuda" && !attention_cuda_built())
        c.fail_at(metrics["device"], "metrics.device",
                  "cuda needs kvarn-eval built with CUDA (-DKVARN_ENABLE_CUDA=ON)");
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
      if (cfg.data.capture) m->check_head_dim(cfg.data.capture->head_dim);
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
    cs.bits_per_element = m->accounting(cfg.data.capture ? cfg.data.capture->head_dim
                                                         : cfg.data.tiles.front().head_dim)
                              .bits_per_element();
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
  json resolved_data = {{"source", cfg.data.source},
                        {"tiles", tiles},
                        {"sequences", selection_json(cfg.data.sequences)},
                        {"layers", selection_json(cfg.data.layers)},
                        {"kv_heads", selection_json(cfg.data.kv_heads)},
                        {"max_tokens", cfg.data.max_tokens}};
  // Only configs with a capture get the key, so tile-only run hashes (the golden) do not change.
  if (cfg.data.capture) resolved_data["capture"] = cfg.data.capture->resolved;
  cfg.resolved = {
      {"schema_version", kConfigSchemaVersion},
      {"name", cfg.name},
      {"data", resolved_data},
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
  // Only a non-default device enters the hash, so cpu configs keep older runs' hash.
  if (cfg.metrics.device != "cpu") cfg.resolved["metrics"]["device"] = cfg.metrics.device;
  cfg.hash = sha256_hex(cfg.resolved.dump());
  return cfg;
}

SweepEstimate estimate_sweep(const SweepConfig& cfg) {
  SweepEstimate e;
  double per_case_seconds = 0, per_case_bytes = 0;
  // One sequence of one data file: `slabs` (layer, KV head) pairs of `tok` tokens each.
  auto add_sequence = [&](double slabs, double tok, double q_per_kv, bool has_q, int head_dim) {
    if (cfg.data.max_tokens > 0) tok = std::min<double>(tok, cfg.data.max_tokens);
    e.slabs += static_cast<std::int64_t>(slabs);
    e.tokens += static_cast<std::int64_t>(slabs * tok);
    if (cfg.metrics.reconstruction) per_case_seconds += slabs * tok * kReconSecondsPerToken;
    if (cfg.metrics.attention && has_q) {
      const double passes = 1.0 + static_cast<double>(cfg.metrics.outlier_percents.size());
      per_case_seconds += slabs * q_per_kv * passes * tok * tok * kAttentionSecondsPerTokenPair *
                          (head_dim / 128.0);
    }
    per_case_bytes += slabs * (kCaseJsonBytesPerSlab + kSummaryBytesPerSlab);
    if (cfg.metrics.arrays) per_case_bytes += slabs * tok * kArrayBytesPerToken;
  };
  if (const auto& cap = cfg.data.capture) {
    const int n = static_cast<int>(cap->sequence_tokens.size());
    const std::vector<int> seqs = cfg.data.sequences.value_or(std::vector<int>());
    const double layers =
        cfg.data.layers ? static_cast<double>(cfg.data.layers->size()) : cap->captured_layers;
    const double heads =
        cfg.data.kv_heads ? static_cast<double>(cfg.data.kv_heads->size()) : cap->num_kv_heads;
    for (int s = 0; s < n; ++s) {
      const double tok = cap->sequence_tokens[static_cast<std::size_t>(s)];
      // The capture: prompt prefill, one decode step per generated token, one capture prefill.
      e.capture_seconds += cap->weight_bytes *
                           (2.0 * tok * kAccumulationSecondsPerTokenByte +
                            std::min<double>(cap->generate, tok) * kAccumulationSecondsPerStepByte);
      e.capture_bytes += tok * cap->captured_layers * cap->head_dim * 2.0 *
                         (3.0 * cap->num_kv_heads + cap->captured_q_heads);
      if (cfg.data.sequences && std::find(seqs.begin(), seqs.end(), s) == seqs.end()) continue;
      add_sequence(layers * heads, tok,
                   static_cast<double>(cap->captured_q_heads) / std::max(1, cap->num_kv_heads),
                   cap->captured_q_heads > 0, cap->head_dim);
    }
  }
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
      // Captured query heads per KV head (captures may hold a subset of the model's).
      add_sequence(static_cast<double>(layers) * heads, si.num_tokens,
                   static_cast<double>(si.q_heads.size()) / std::max(1, r.info().num_kv_heads),
                   si.has_q, t.head_dim);
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
  e.seconds = per_case_seconds * static_cast<double>(cfg.cases.size()) + e.capture_seconds;
  e.bytes = per_case_bytes * static_cast<double>(cfg.cases.size()) + e.capture_bytes;
  return e;
}

}  // namespace kvarn
