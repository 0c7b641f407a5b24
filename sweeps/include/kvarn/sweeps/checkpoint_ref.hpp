// A checkpoint directory named by a config section, as the parser checked it.
#ifndef KVARN_SWEEPS_CHECKPOINT_REF_HPP_
#define KVARN_SWEEPS_CHECKPOINT_REF_HPP_

#include <filesystem>
#include <string>

namespace kvarn {

struct CheckpointRef {
  std::string path;                // as written
  std::filesystem::path resolved;  // the directory
  std::string name;                // directory name, the `data` of its summary rows
  std::string fingerprint;         // of model.safetensors (or config.json when sharded)
  int head_dim = 0, num_layers = 0, vocab_size = 0, max_position_embeddings = 0;
};

}  // namespace kvarn

#endif  // KVARN_SWEEPS_CHECKPOINT_REF_HPP_
