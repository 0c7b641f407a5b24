// `data.capture` / `data.fallback.capture`: keys and types always; with the runner, everything
// the capture will read (RunnerSteps::resolve_capture: checkpoint config, prompts, index lists,
// context length).
#include <algorithm>

#include "config_parse.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"
#include "runner_steps.hpp"

namespace kvarn::config_detail {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSection = "data.capture";

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
std::string index_list_text(const Ctx& c, const YAML::Node& n, const std::string& key,
                            const ConfigKey& spec) {
  if (n.IsScalar()) return n.Scalar();
  if (!n.IsSequence() || n.size() == 0) {
    c.fail_at(n, key,
              "expected 'all', a list of indices or a range such as 0-3, got " + type_name(n));
  }
  std::string out;
  for (std::size_t i = 0; i < n.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(get_int(c, n[i], key + "." + std::to_string(i), spec.min, spec.max));
  }
  return out;
}

std::string required_string(const Ctx& c, const YAML::Node& n, const std::string& key,
                            const char* name, const char* what) {
  if (!present(n[name])) c.fail_at(n, key + "." + name, std::string("missing (") + what + ")");
  return get_string(c, n[name], key + "." + name);
}

// Every key of the block, checked for type and range; nothing on disk is read.
void read_capture_keys(const Ctx& c, const YAML::Node& n, const std::string& key,
                       CaptureSpec& cap) {
  cap.model =
      required_string(c, n, key, "model", "a checkpoint directory with config.json, or a hub id");
  cap.prompts = required_string(c, n, key, "prompts",
                                "a JSONL file of {\"id\", \"text\"} or {\"id\", \"token_ids\"}");
  read_int(c, n, key, config_key(kSection, "generate"), cap.generate);
  read_int(c, n, key, config_key(kSection, "max_tokens"), cap.max_tokens);
  read_int(c, n, key, config_key(kSection, "threads"), cap.threads);
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
    if (n[k].IsDefined()) *out = index_list_text(c, n[k], key + "." + k, config_key(kSection, k));
  }
  const YAML::Node ids = n["prompt_ids"];
  if (present(ids)) {
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
}

// The checkpoint directory; false when the model is not on disk and reads as a hub id.
bool locate_checkpoint(const Ctx& c, const YAML::Node& n, const std::string& key,
                       const fs::path& config_path, CaptureSpec& cap) {
  const std::string mkey = key + ".model";
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
  return true;
}

}  // namespace

bool parse_capture(const Ctx& c, const YAML::Node& n, const std::string& key,
                   const fs::path& config_path, CaptureSpec& cap) {
  require_map(c, n, key);
  check_keys(c, n, key, config_section_keys(kSection));
  cap.key = key;
  read_capture_keys(c, n, key, cap);
  if (!locate_checkpoint(c, n, key, config_path, cap)) return false;
  if (runner_steps().available()) runner_steps().resolve_capture(c, n, key, config_path, cap);
  return true;
}

}  // namespace kvarn::config_detail
