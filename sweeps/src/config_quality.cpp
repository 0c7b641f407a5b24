// `quality:` with enabled: true. Models, the text file and the per-layer method list are checked
// here, so a bad path or spec fails before anything runs.
#include <algorithm>
#include <set>

#include "config_parse.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/provenance.hpp"
#include "runner_steps.hpp"

namespace kvarn::config_detail {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSection = "quality";

QualityModel load_checkpoint(const Ctx& c, const YAML::Node& node, const std::string& key,
                             const fs::path& config_path, int window, QualityModel qm);

// quality.windows (or a model entry's `windows`): a count or `all` (0).
int read_windows(const Ctx& c, const YAML::Node& w, const std::string& key) {
  if (w.IsScalar() && w.Scalar() == "all") return 0;
  return static_cast<int>(get_int(c, w, key, 1, 1 << 20));
}

// One checkpoint directory the runner can load, with a tokenizer (the text is tokenized): a path,
// or a mapping {path, window, windows} overriding the section's window and window count.
QualityModel load_model(const Ctx& c, const YAML::Node& entry, const std::string& key,
                        const fs::path& config_path, const QualitySettings& s) {
  QualityModel qm;
  int window = s.window;
  qm.windows = s.windows;
  if (!entry.IsMap()) return load_checkpoint(c, entry, key, config_path, window, std::move(qm));
  check_keys(c, entry, key, {"path", "window", "windows"});
  if (!present(entry["path"])) c.fail_at(entry, key + ".path", "missing: a checkpoint directory");
  if (present(entry["window"])) {
    window = static_cast<int>(get_int(c, entry["window"], key + ".window", 2, 1 << 22));
  }
  if (present(entry["windows"])) qm.windows = read_windows(c, entry["windows"], key + ".windows");
  // (YAML::Node assignment would write into the config's tree: pass the child directly.)
  return load_checkpoint(c, entry["path"], key + ".path", config_path, window, std::move(qm));
}

QualityModel load_checkpoint(const Ctx& c, const YAML::Node& node, const std::string& key,
                             const fs::path& config_path, int window, QualityModel qm) {
  static_cast<CheckpointRef&>(qm) =
      read_checkpoint(c, node, key, config_path, "quality.text is tokenized");
  // A window past the trained positions would measure the model out of its training.
  qm.window = std::min(window, qm.max_position_embeddings);
  return qm;
}

void parse_models(const Ctx& c, const YAML::Node& q, const fs::path& config_path,
                  QualitySettings& s, std::vector<std::string>& notices,
                  const std::string& config_name) {
  const YAML::Node mn = q["model"];
  if (!present(mn)) c.fail_at(q, "quality.model", "missing: a checkpoint directory (or a list)");
  std::vector<std::pair<YAML::Node, std::string>> nodes;
  if (mn.IsSequence()) {
    if (mn.size() == 0) c.fail_at(mn, "quality.model", "empty list");
    for (std::size_t i = 0; i < mn.size(); ++i)
      nodes.emplace_back(mn[i], "quality.model." + std::to_string(i));
  } else {
    nodes.emplace_back(mn, "quality.model");
  }
  std::set<std::string> names;
  for (const auto& [node, key] : nodes) {
    QualityModel qm = load_model(c, node, key, config_path, s);
    if (!names.insert(qm.name).second) c.fail_at(node, key, "model listed twice: " + qm.name);
    const int asked = node.IsMap() && present(node["window"]) ? node["window"].as<int>() : s.window;
    if (qm.window < asked) {
      notices.push_back(config_name + ": quality: " + qm.name + " runs " +
                        std::to_string(qm.window) + "-token windows (its max_position_embeddings)");
    }
    s.models.push_back(std::move(qm));
  }
}

// Integers, the text file, the policy, device and the per-layer part.
void read_settings(const Ctx& c, const YAML::Node& q, const fs::path& config_path,
                   QualitySettings& s) {
  read_int(c, q, kSection, config_key(kSection, "window"), s.window);
  read_int(c, q, kSection, config_key(kSection, "block"), s.block);
  read_int(c, q, kSection, config_key(kSection, "bucket"), s.bucket);
  read_int(c, q, kSection, config_key(kSection, "per_layer_windows"), s.per_layer_windows);
  read_int(c, q, kSection, config_key(kSection, "resamples"), s.resamples);
  read_int(c, q, kSection, config_key(kSection, "threads"), s.threads);
  if (const YAML::Node w = q["windows"]; present(w)) s.windows = read_windows(c, w, "quality.windows");
  const YAML::Node tn = q["text"];
  if (!present(tn)) c.fail_at(q, "quality.text", "missing: a UTF-8 text file");
  s.text = get_string(c, tn, "quality.text");
  s.text_resolved = resolve_input_path(s.text, config_path);
  std::error_code ec;
  if (s.text_resolved.empty() || !fs::is_regular_file(s.text_resolved, ec))
    c.fail_at(tn, "quality.text", "not a regular file: " + s.text);
  s.text_fingerprint = file_fingerprint(s.text_resolved);
  if (const YAML::Node ct = q["current_token"]; present(ct)) {
    s.current_token = get_string(c, ct, "quality.current_token");
    if (s.current_token != "exact" && s.current_token != "quantized")
      c.fail_at(ct, "quality.current_token", "expected exact or quantized");
  }
  if (const YAML::Node d = q["device"]; present(d)) {
    s.device = get_string(c, d, "quality.device");
    const bool ok = s.device == "cpu" || s.device == "cuda" || s.device.rfind("cuda:", 0) == 0;
    if (!ok) c.fail_at(d, "quality.device", "expected cpu, cuda or cuda:N");
  }
  if (const YAML::Node p = q["per_layer"]; present(p)) {
    s.per_layer = get_bool(c, p, "quality.per_layer");
  }
  if (const YAML::Node pm = q["per_layer_methods"]; present(pm)) {
    if (!pm.IsSequence() || pm.size() == 0)
      c.fail_at(pm, "quality.per_layer_methods", "expected a non-empty list of method specs");
    for (std::size_t i = 0; i < pm.size(); ++i) {
      const std::string k = "quality.per_layer_methods." + std::to_string(i);
      try {
        s.per_layer_methods.push_back(make_method(get_string(c, pm[i], k))->spec());
      } catch (const Error& e) {
        c.fail_at(pm[i], k, e.what());
      }
    }
  }
}

}  // namespace

void parse_quality(const Ctx& c, const YAML::Node& q, const fs::path& config_path,
                   SweepConfig& cfg) {
  QualitySettings& s = cfg.quality;
  if (!runner_steps().available()) {
    s = QualitySettings{};
    cfg.notices.push_back(cfg.name +
                          ": quality skipped: this kvarn-eval was built without the libtorch "
                          "model runner (scripts/install_deps.sh installs torch; rebuild)");
    return;
  }
  read_settings(c, q, config_path, s);
  parse_models(c, q, config_path, s, cfg.notices, cfg.name);
}

// The resolved `quality` block (only configs that enable it carry the key).
json quality_json(const QualitySettings& s) {
  json models = json::array();
  for (const QualityModel& m : s.models) {
    models.push_back(
        {{"path", m.path}, {"name", m.name}, {"fingerprint", m.fingerprint}, {"window", m.window},
         {"windows", m.windows == 0 ? json("all") : json(m.windows)}});
  }
  return {{"enabled", true},
          {"models", models},
          {"text", s.text},
          {"text_fingerprint", s.text_fingerprint},
          {"window", s.window},
          {"windows", s.windows == 0 ? json("all") : json(s.windows)},
          {"block", s.block},
          {"current_token", s.current_token},
          {"bucket", s.bucket},
          {"per_layer", s.per_layer},
          {"per_layer_methods", s.per_layer_methods},
          {"per_layer_windows", s.per_layer_windows},
          {"resamples", s.resamples},
          {"device", s.device}};
}

}  // namespace kvarn::config_detail
