// `accumulation:` with enabled: true. Files and the model's config are checked here, so a bad
// path or an unsupported checkpoint fails before anything runs.
#include <algorithm>
#include <set>
#include <sstream>

#include "config_parse.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/provenance.hpp"
#include "runner_steps.hpp"

namespace kvarn::config_detail {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSection = "accumulation";
const std::vector<std::string> kAccumulationModes = {"pseudo_decode", "teacher_forced",
                                                     "free_running"};

// block/context/decode_steps/threads, seed, sampling, device and modes.
void read_settings(const Ctx& c, const YAML::Node& acc, std::int64_t top_seed,
                   AccumulationSettings& a) {
  read_int(c, acc, kSection, config_key(kSection, "block"), a.block);
  read_int(c, acc, kSection, config_key(kSection, "context"), a.context);
  read_int(c, acc, kSection, config_key(kSection, "decode_steps"), a.decode_steps);
  read_int(c, acc, kSection, config_key(kSection, "threads"), a.threads);
  a.seed = top_seed;
  read_int(c, acc, kSection, config_key(kSection, "seed"), a.seed);
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
  if (acc["static_replay"].IsDefined())
    a.static_replay = get_bool(c, acc["static_replay"], "accumulation.static_replay");
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
}

// Current-token policy: one of exact / quantized, or a list of both (each a separate run).
void read_current_token(const Ctx& c, const YAML::Node& acc, AccumulationSettings& a) {
  const YAML::Node ct = acc["current_token"];
  if (!ct.IsDefined()) return;
  a.current_token.clear();
  const bool list = ct.IsSequence();
  if (list && ct.size() == 0) c.fail_at(ct, "accumulation.current_token", "empty list");
  for (std::size_t i = 0; i < (list ? ct.size() : 1); ++i) {
    const YAML::Node n = list ? ct[i] : ct;
    const std::string k =
        list ? "accumulation.current_token." + std::to_string(i) : "accumulation.current_token";
    const std::string v = get_string(c, n, k);
    if (v != "exact" && v != "quantized") c.fail_at(n, k, "expected exact or quantized");
    if (std::find(a.current_token.begin(), a.current_token.end(), v) != a.current_token.end())
      c.fail_at(n, k, std::string(1, '\'').append(v).append("' given twice"));
    a.current_token.push_back(v);
  }
}

// One checkpoint directory the runner can load, with context + decode_steps within its context.
AccumulationModel load_model(const Ctx& c, const YAML::Node& acc, const YAML::Node& node,
                             const std::string& key, const fs::path& config_path,
                             const AccumulationSettings& a) {
  const CheckpointRef ck = read_checkpoint(c, node, key, config_path, "prompts are text");
  if (a.context + a.decode_steps > ck.max_position_embeddings) {
    c.fail_at(acc["context"].IsDefined() ? acc["context"] : node, "accumulation.context",
              "context + decode_steps = " + std::to_string(a.context + a.decode_steps) +
                  " exceeds " + ck.path + "'s max_position_embeddings " +
                  std::to_string(ck.max_position_embeddings));
  }
  AccumulationModel am;
  static_cast<CheckpointRef&>(am) = ck;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(am.resolved, ec)) {
    if (e.path().extension() == ".safetensors")
      am.weight_bytes += static_cast<double>(e.file_size(ec));
  }
  return am;
}

// Models: one path or a list; each a checkpoint directory the runner can load.
void parse_models(const Ctx& c, const YAML::Node& acc, const fs::path& config_path,
                  AccumulationSettings& a) {
  const YAML::Node mn = acc["model"];
  if (!present(mn)) {
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
    AccumulationModel am = load_model(c, acc, node, key, config_path, a);
    if (!names.insert(am.name).second) c.fail_at(node, key, "model listed twice: " + am.name);
    a.models.push_back(std::move(am));
  }
}

// {id, text} or {id, token_ids} (token ids run where the build has no tokenizer).
struct FilePrompt {
  std::string id, text;
  std::vector<std::int32_t> token_ids;
};

// The prompts file, one JSON object per line (read within kMaxConfigInputBytes).
std::vector<FilePrompt> read_prompts(const Ctx& c, const YAML::Node& pn,
                                     const AccumulationSettings& a) {
  std::string text;
  try {
    text = read_bounded(a.prompts_resolved, kMaxConfigInputBytes, "prompts file");
  } catch (const Error& e) {
    c.fail_at(pn, "accumulation.prompts", e.what());
  }
  std::vector<FilePrompt> out;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json j = json::parse(line, nullptr, false);
    const bool has_text = j.is_object() && j.contains("text") && j["text"].is_string();
    bool ids_ok = j.is_object() && j.contains("token_ids") && j["token_ids"].is_array() &&
                  !j["token_ids"].empty();
    FilePrompt fp;
    for (std::size_t i = 0; ids_ok && i < j["token_ids"].size(); ++i) {
      const json& t = j["token_ids"][i];
      ids_ok = t.is_number_integer() && t.get<long long>() >= 0 && t.get<long long>() < (1 << 30);
      if (ids_ok) fp.token_ids.push_back(static_cast<std::int32_t>(t.get<long long>()));
    }
    if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j["id"].is_string() ||
        has_text == ids_ok) {
      c.fail_at(pn, "accumulation.prompts",
                a.prompts + ":" + std::to_string(lineno) +
                    ": expected a JSON object with a string id and either a string text or "
                    "token_ids (a non-empty list of non-negative integers)");
    }
    fp.id = j["id"].get<std::string>();
    if (has_text) fp.text = j["text"].get<std::string>();
    out.push_back(std::move(fp));
  }
  return out;
}

// Prompts: the file's prompts selected by prompt_ids (default: the first one).
void parse_prompts(const Ctx& c, const YAML::Node& acc, const fs::path& config_path,
                   AccumulationSettings& a) {
  const YAML::Node pn = acc["prompts"];
  if (!present(pn)) {
    c.fail_at(acc, "accumulation.prompts", "missing: a JSONL file of {\"id\", \"text\"}");
  }
  a.prompts = get_string(c, pn, "accumulation.prompts");
  a.prompts_resolved = resolve_input_path(a.prompts, config_path);
  if (a.prompts_resolved.empty())
    c.fail_at(pn, "accumulation.prompts", "file not found: " + a.prompts);
  const std::vector<FilePrompt> file_prompts = read_prompts(c, pn, a);
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
  const YAML::Node pi = acc["prompt_ids"];
  if (!present(pi)) return select(0);
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
}

}  // namespace

void parse_accumulation(const Ctx& c, const YAML::Node& acc, const fs::path& config_path,
                        SweepConfig& cfg) {
  AccumulationSettings& a = cfg.accumulation;
  if (!runner_steps().available()) {
    // The main job must still run where torch was skipped: say so and go on without it.
    a = AccumulationSettings{};
    cfg.notices.push_back(
        cfg.name +
        ": accumulation skipped: this kvarn-eval was built without the "
        "libtorch model runner (scripts/install_deps.sh installs torch; rebuild)");
    return;
  }
  read_settings(c, acc, cfg.seed, a);
  read_current_token(c, acc, a);
  parse_models(c, acc, config_path, a);
  parse_prompts(c, acc, config_path, a);
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
  if (!a.static_replay) out["static_replay"] = false;
  return out;
}

}  // namespace kvarn::config_detail
