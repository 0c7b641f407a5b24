// YAML sweep config: read, override, then each section's parser (config_*.cpp) validates its keys
// with file:line:col errors; finally the canonical resolved config and its hash.
#include "kvarn/sweeps/config.hpp"

#include <algorithm>
#include <charconv>
#include <sstream>

#include "config_parse.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/tile_file.hpp"
#include "kvarn/eval/attention.hpp"
#include "kvarn/sweeps/provenance.hpp"

namespace kvarn {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace config_detail;

void apply_set(YAML::Node node, const std::vector<std::string>& segs, std::size_t i,
               const YAML::Node& value, const std::string& text) {
  const std::string& seg = segs[i];
  const bool last = i + 1 == segs.size();
  const bool is_index = !seg.empty() && std::all_of(seg.begin(), seg.end(), ::isdigit);
  if (node.IsSequence()) {
    KVARN_CHECK(is_index, "--set ", text, ": '", seg, "' indexes a list and must be a number");
    std::size_t idx = 0;
    const auto [end, ec] = std::from_chars(seg.data(), seg.data() + seg.size(), idx);
    KVARN_CHECK(ec == std::errc() && (idx < node.size() || (last && idx == node.size())), "--set ",
                text, ": index ", seg, " out of range (the list has ", node.size(), " entries)");
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

// The config file (within kMaxConfigBytes) parsed as YAML, with every --set applied in order.
YAML::Node load_yaml(const fs::path& path, const std::vector<std::string>& sets, std::string& text,
                     std::set<std::string>& overridden) {
  text = read_bounded(path, kMaxConfigBytes, "config");
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    fail(path.string(), ":", e.mark.line + 1, ":", e.mark.column + 1,
         ": YAML syntax error: ", e.msg);
  }
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
  return root;
}

// version, name, description.
void parse_header(const Ctx& c, const YAML::Node& root, SweepConfig& cfg) {
  if (!root["version"].IsDefined()) c.fail_at(root, "version", "missing (schema version, 1)");
  read_int(c, root, "", config_key("", "version"), cfg.version);
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
  if (present(root["description"])) {
    cfg.description = get_string(c, root["description"], "description");
  }
}

void parse_metrics(const Ctx& c, const YAML::Node& metrics, MetricsSelection& m) {
  if (!present(metrics)) return;
  require_map(c, metrics, "metrics");
  check_keys(c, metrics, "metrics", config_section_keys("metrics"));
  for (auto [k, out] : {std::pair<const char*, bool*>{"reconstruction", &m.reconstruction},
                        {"attention", &m.attention},
                        {"arrays", &m.arrays}}) {
    if (metrics[k].IsDefined()) *out = get_bool(c, metrics[k], std::string("metrics.") + k);
  }
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
    const ConfigKey& spec = config_key("metrics", "topk");
    for (std::size_t i = 0; i < tk.size(); ++i) {
      const std::string k = "metrics.topk." + std::to_string(i);
      m.topk.push_back(static_cast<int>(get_int(c, tk[i], k, spec.min, spec.max)));
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
  read_int(c, metrics, "metrics", config_key("metrics", "threads"), m.threads);
  if (!m.reconstruction && !m.attention) {
    c.fail_at(metrics, "metrics", "both reconstruction and attention are off: nothing to measure");
  }
}

void parse_throughput(const Ctx& c, const YAML::Node& tp, const fs::path& path, SweepConfig& cfg) {
  if (!present(tp)) return;
  require_map(c, tp, "throughput");
  check_keys(c, tp, "throughput", config_section_keys("throughput"));
  if (!present(tp["results"])) return;
  cfg.throughput_results = get_string(c, tp["results"], "throughput.results");
  cfg.throughput_resolved = resolve_input_path(cfg.throughput_results, path);
  if (cfg.throughput_resolved.empty()) {
    c.fail_at(tp["results"], "throughput.results",
              "file not found: " + cfg.throughput_results +
                  " (GPU benchmark JSON, e.g. bench/results/*.json)");
  }
  std::string text;
  try {
    text = read_bounded(cfg.throughput_resolved, kMaxConfigInputBytes, "benchmark JSON");
  } catch (const Error& e) {
    c.fail_at(tp["results"], "throughput.results", e.what());
  }
  if (json::parse(text, nullptr, false).is_discarded()) {
    c.fail_at(tp["results"], "throughput.results", cfg.throughput_results + " is not valid JSON");
  }
}

// seed, output, report.
void parse_run_keys(const Ctx& c, const YAML::Node& root, SweepConfig& cfg) {
  read_int(c, root, "", config_key("", "seed"), cfg.seed);
  if (root["output"].IsDefined()) {
    cfg.output = get_string(c, root["output"], "output");
    if (cfg.output.empty()) c.fail_at(root["output"], "output", "must not be empty");
  }
  if (root["report"].IsDefined()) cfg.report = get_bool(c, root["report"], "report");
}

// Attention needs queries: a tile file without q skips attention, with a notice.
void note_missing_queries(SweepConfig& cfg) {
  if (!cfg.metrics.attention) return;
  for (const TilesSource& t : cfg.data.tiles) {
    if (!t.has_queries) {
      cfg.notices.push_back("warning: " + t.path +
                            " has no captured queries: attention metrics are skipped for it");
    }
  }
}

json selection_json(const std::optional<std::vector<int>>& s) { return s ? json(*s) : json("all"); }

// The canonical resolved config (what resolved.json holds) and its hash.
void resolve(SweepConfig& cfg) {
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
  // Only configs with a capture get the key, so tile-only run hashes (the golden) do not change;
  // one capture is its spec, several a list of specs.
  if (cfg.data.captures.size() == 1) resolved_data["capture"] = cfg.data.captures[0].resolved;
  if (cfg.data.captures.size() > 1) {
    json specs = json::array();
    for (const CaptureSpec& cap : cfg.data.captures) specs.push_back(cap.resolved);
    resolved_data["capture"] = specs;
  }
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
  // Only configs with quality enabled get the key, so other run hashes do not change.
  if (cfg.quality.enabled) cfg.resolved["quality"] = quality_json(cfg.quality);
  // Only configs with retrieval get the key, so older runs keep their hash.
  if (cfg.retrieval.enabled) cfg.resolved["retrieval"] = retrieval_json(cfg.retrieval);
  cfg.hash = sha256_hex(cfg.resolved.dump());
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
  std::set<std::string> overridden;
  const YAML::Node root = load_yaml(path, sets, cfg.config_text, overridden);
  const Ctx c(path.string(), overridden);
  if (!root.IsMap())
    c.fail_at(root, "(root)", "expected a mapping of config keys, got " + type_name(root));
  check_keys(c, root, "", config_section_keys(""));
  parse_header(c, root, cfg);
  parse_data(c, root, path, cfg);
  parse_metrics(c, root["metrics"], cfg.metrics);
  if (const YAML::Node acc = root["accumulation"]; present(acc)) {
    require_map(c, acc, "accumulation");
    check_keys(c, acc, "accumulation", config_section_keys("accumulation"));
    if (acc["enabled"].IsDefined()) {
      cfg.accumulation.enabled = get_bool(c, acc["enabled"], "accumulation.enabled");
    }
    // Parsed before the top-level seed, so an absent accumulation.seed takes the default 0
    // (kept: it is part of existing run hashes).
    if (cfg.accumulation.enabled) parse_accumulation(c, acc, path, cfg);
  }
  if (const YAML::Node q = root["quality"]; present(q)) {
    require_map(c, q, "quality");
    check_keys(c, q, "quality", config_section_keys("quality"));
    if (q["enabled"].IsDefined())
      cfg.quality.enabled = get_bool(c, q["enabled"], "quality.enabled");
    if (cfg.quality.enabled) parse_quality(c, q, path, cfg);
  }
  if (const YAML::Node rn = root["retrieval"]; present(rn)) {
    require_map(c, rn, "retrieval");
    check_keys(c, rn, "retrieval", config_section_keys("retrieval"));
    if (rn["enabled"].IsDefined())
      cfg.retrieval.enabled = get_bool(c, rn["enabled"], "retrieval.enabled");
    if (cfg.retrieval.enabled) parse_retrieval(c, rn, path, cfg);
  }
  parse_throughput(c, root["throughput"], path, cfg);
  parse_run_keys(c, root, cfg);
  resolve_cases(c, root["methods"], cfg);
  note_missing_queries(cfg);
  resolve(cfg);
  return cfg;
}

}  // namespace kvarn
