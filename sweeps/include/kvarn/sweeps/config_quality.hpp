// `quality:` (docs/config-schema.md): model-level KLD / perplexity against fp16 with each case's
// method in the loop, over windows of held-out text (kvarn/runner/quality.hpp), and per-layer
// sensitivity (one layer quantized at a time).
#ifndef KVARN_SWEEPS_CONFIG_QUALITY_HPP_
#define KVARN_SWEEPS_CONFIG_QUALITY_HPP_

#include <filesystem>
#include <string>
#include <vector>

#include "kvarn/sweeps/checkpoint_ref.hpp"

namespace kvarn {

struct QualityModel : CheckpointRef {
  int window = 0;   // its entry's window or quality.window, capped at max_position_embeddings
  int windows = 0;  // its entry's windows or quality.windows (0: all)
};

struct QualitySettings {
  bool enabled = false;
  std::vector<QualityModel> models;
  std::string text;  // UTF-8 file as written
  std::filesystem::path text_resolved;
  std::string text_fingerprint;
  int window = 2048;  // tokens per window
  int windows = 0;    // 0: every window the text holds
  int block = 32;     // pseudo-decode block
  std::string current_token = "exact";
  int bucket = 512;  // position-bucket width, tokens
  bool per_layer = false;
  std::vector<std::string> per_layer_methods;  // canonical specs; empty: every case
  int per_layer_windows = 4;
  int resamples = 1000;  // bootstrap resamples over windows
  std::string device = "cpu";
  int threads = 0;  // CPU intra-op threads; not hashed
  // Where the fp16 reference log-probs are kept: <run dir>/quality (set by the engine; not
  // hashed). Empty: a folder under the system's temporary directory.
  std::filesystem::path cache_dir;
};

}  // namespace kvarn

#endif  // KVARN_SWEEPS_CONFIG_QUALITY_HPP_
