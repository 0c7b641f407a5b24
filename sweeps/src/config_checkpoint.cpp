// The checkpoint directory a config section names (`quality.model`, `retrieval.*.model`,
// `accumulation.model`): the same checks and facts for every section, read once here.
#include <string>
#include <system_error>

#include "config_parse.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/sweeps/provenance.hpp"
#include "runner_steps.hpp"

namespace kvarn::config_detail {

namespace fs = std::filesystem;

CheckpointRef read_checkpoint(const Ctx& c, const YAML::Node& node, const std::string& key,
                              const fs::path& config_path, const std::string& tokenizer_use) {
  CheckpointRef ck;
  ck.path = get_string(c, node, key);
  ck.resolved = resolve_input_path(ck.path, config_path);
  std::error_code ec;
  if (ck.resolved.empty() || !fs::is_regular_file(ck.resolved / "config.json", ec)) {
    const bool prepared = ck.path.find("smollm2") != std::string::npos;
    c.fail_at(node, key,
              "not a checkpoint directory (config.json not found): " + ck.path +
                  (prepared ? " (scripts/prepare_models.sh prepares it)" : ""));
  }
  if (!tokenizer_use.empty() && !fs::is_regular_file(ck.resolved / "tokenizer.json", ec)) {
    c.fail_at(node, key, ck.path + " has no tokenizer.json (" + tokenizer_use + ")");
  }
  try {
    const CheckpointShape s = runner_steps().checkpoint_shape(ck.resolved / "config.json");
    ck.head_dim = s.head_dim;
    ck.num_layers = s.num_layers;
    ck.vocab_size = s.vocab_size;
    ck.max_position_embeddings = s.max_position_embeddings;
  } catch (const Error& e) {
    c.fail_at(node, key, e.what());
  }
  // Sharded checkpoints have no single weights file: their config stands for them.
  const fs::path weights = fs::is_regular_file(ck.resolved / "model.safetensors", ec)
                               ? ck.resolved / "model.safetensors"
                               : ck.resolved / "config.json";
  ck.fingerprint = file_fingerprint(weights);
  ck.name = ck.resolved.filename().string();
  if (ck.name.empty()) ck.name = ck.resolved.parent_path().filename().string();
  return ck;
}

}  // namespace kvarn::config_detail
