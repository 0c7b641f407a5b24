// RunnerSteps with the libtorch model runner (runner_steps.hpp): the config's capture checks,
// the engine's capture step and error accumulation.
#include "runner_steps.hpp"

#include <algorithm>
#include <memory>

#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/runner/capture.hpp"
#include "kvarn/runner/model.hpp"
#include "kvarn/runner/tokenizer.hpp"
#include "kvarn/sweeps/provenance.hpp"

namespace kvarn {

namespace {

namespace fs = std::filesystem;
using config_detail::Ctx;
using config_detail::present;
using nlohmann::json;

// The prompts file, reduced to prompt_ids (in their order) when given.
std::vector<CapturePrompt> load_selected_prompts(const Ctx& c, const YAML::Node& n,
                                                 const std::string& key,
                                                 const fs::path& config_path, CaptureSpec& cap) {
  const std::string pkey = key + ".prompts";
  cap.prompts_resolved = resolve_input_path(cap.prompts, config_path);
  if (cap.prompts_resolved.empty()) c.fail_at(n["prompts"], pkey, "file not found: " + cap.prompts);
  std::vector<CapturePrompt> prompts;
  try {
    prompts = load_capture_prompts(cap.prompts_resolved);
  } catch (const Error& e) {
    c.fail_at(n["prompts"], pkey, e.what());
  }
  if (prompts.empty()) c.fail_at(n["prompts"], pkey, cap.prompts + " holds no prompts");
  if (cap.prompt_ids.empty()) return prompts;
  std::vector<std::string> known;
  for (const CapturePrompt& p : prompts) known.push_back(p.id);
  std::vector<CapturePrompt> chosen;
  for (std::size_t i = 0; i < cap.prompt_ids.size(); ++i) {
    const std::string& id = cap.prompt_ids[i];
    const auto it = std::find(known.begin(), known.end(), id);
    if (it == known.end()) {
      c.fail_at(
          n["prompt_ids"][i], key + ".prompt_ids." + std::to_string(i),
          "no prompt '" + id + "' in " + cap.prompts + " (nearest: " + nearest(id, known, 1) + ")");
    }
    chosen.push_back(prompts[static_cast<std::size_t>(it - known.begin())]);
  }
  return chosen;
}

// The checkpoint's config and the layer / head index lists against it.
ModelConfig check_model_and_indices(const Ctx& c, const YAML::Node& n, const std::string& key,
                                    CaptureSpec& cap) {
  ModelConfig mc;
  try {
    mc = load_model_config(cap.model_resolved / "config.json");
  } catch (const Error& e) {
    c.fail_at(n["model"], key + ".model", e.what());
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
  return mc;
}

// Token counts per sequence (the estimate, and the context check before anything runs).
void count_sequence_tokens(const Ctx& c, const YAML::Node& n, const std::string& key,
                           const std::vector<CapturePrompt>& prompts, const ModelConfig& mc,
                           CaptureSpec& cap) {
  const std::string mkey = key + ".model", pkey = key + ".prompts";
  const bool any_text = std::any_of(prompts.begin(), prompts.end(),
                                    [](const CapturePrompt& p) { return !p.has_token_ids; });
  std::unique_ptr<Tokenizer> tok;
  std::error_code ec;
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
}

// The canonical spec with fingerprints of what determines the captured values, and its hash.
void resolve_capture_spec(CaptureSpec& cap) {
  json files = json::object();
  std::error_code ec;
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
}

// The engine's capture: the same run_capture as `kvarn-eval capture`, with the sweep's
// provenance and the spec hash a resume compares.
void run_capture_into(const SweepConfig& cfg, const CaptureSpec& cap, const fs::path& file,
                      bool overwrite, const std::string& command, std::FILE* log) {
  CaptureOptions o;
  o.model_dir = cap.model_resolved;
  o.prompts = cap.prompts_resolved;
  o.out = file;
  o.ids = cap.prompt_ids;
  o.layers = cap.layers;
  o.kv_heads = cap.kv_heads;
  o.query_heads = cap.query_heads;
  o.max_tokens = cap.max_tokens;
  o.generate = cap.generate;
  o.ignore_eos = cap.ignore_eos;
  o.chat = cap.chat;
  o.device = cap.device;
  o.num_threads = cap.threads;
  o.force = overwrite;
  o.model_name = cap.name;
  const json build = collect_provenance({{"command", command}});
  o.provenance = {
      {"tool", "kvarn-eval sweep (" + cap.key + ")"},
      {"git_commit", build.value("git_commit", json("unknown"))},
      {"git_dirty", build.value("git_dirty", json(nullptr))},
      {"command", command},
      {"build", build},
      {"sweep", {{"config", cfg.name}, {"spec", cap.resolved}, {"spec_hash", cap.hash}}}};
  o.sha256_file = [](const fs::path& p) { return sha256_file_hex(p); };
  o.log = [log](const std::string& line) {
    std::fprintf(log, "[capture] %s\n", line.c_str());
    std::fflush(log);
  };
  run_capture(o);
}

class TorchRunnerSteps final : public RunnerSteps {
 public:
  bool available() const override { return true; }
  void resolve_capture(const Ctx& c, const YAML::Node& n, const std::string& key,
                       const fs::path& config_path, CaptureSpec& cap) const override {
    const std::vector<CapturePrompt> prompts = load_selected_prompts(c, n, key, config_path, cap);
    const ModelConfig mc = check_model_and_indices(c, n, key, cap);
    count_sequence_tokens(c, n, key, prompts, mc, cap);
    resolve_capture_spec(cap);
  }
  CheckpointShape checkpoint_shape(const fs::path& config_json) const override {
    const ModelConfig mc = load_model_config(config_json);
    return {mc.head_dim, mc.num_layers, mc.vocab_size, mc.max_position_embeddings};
  }
  void capture(const SweepConfig& cfg, const CaptureSpec& cap, const fs::path& file, bool overwrite,
               const std::string& command, std::FILE* log) const override {
    run_capture_into(cfg, cap, file, overwrite, command, log);
  }
  AccumulationCase accumulation_case(const SweepConfig& cfg, const CaseSpec& cs) const override {
    return run_accumulation_case(cfg, cs);
  }
  void write_accumulation_arrays(H5::Group& root, const AccumulationCase& acc) const override {
    kvarn::write_accumulation_arrays(root, acc);
  }
  QualityCase quality_case(const SweepConfig& cfg, const CaseSpec& cs) const override {
    return run_quality_case(cfg, cs);
  }
  RetrievalCase retrieval_case(const SweepConfig& cfg, const CaseSpec& cs) const override {
    return run_retrieval_case(cfg, cs);
  }
};

}  // namespace

const RunnerSteps& runner_steps() {
  static const TorchRunnerSteps steps;
  return steps;
}

}  // namespace kvarn
