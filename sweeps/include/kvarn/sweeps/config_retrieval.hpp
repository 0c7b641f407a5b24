// `retrieval:` (docs/config-schema.md): passkey retrieval and induction copy with each case's
// method in the model loop (kvarn/runner/retrieval.hpp).
#ifndef KVARN_SWEEPS_CONFIG_RETRIEVAL_HPP_
#define KVARN_SWEEPS_CONFIG_RETRIEVAL_HPP_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kvarn/sweeps/checkpoint_ref.hpp"

namespace kvarn {

// A checkpoint directory the runner loads, with what the sweep needs of its config.json.
using RetrievalModel = CheckpointRef;

// Passkey: a digit key planted at each depth of a filler haystack of each length (in tokens).
struct PasskeySettings {
  bool enabled = false;
  RetrievalModel model;
  std::string filler;  // sentences, one a line (text file, or JSONL whose "text" fields hold lines)
  std::filesystem::path filler_resolved;
  std::vector<int> lengths = {1024, 2048};
  std::vector<double> depths = {0.0, 0.5, 1.0};
  int trials = 4, digits = 5, decode_steps = 8;
  bool chat = true;  // wrap in the model's ChatML turn (system, user, assistant)
  // Prompt pieces; "{key}" in the needle is the passkey. The defaults are a wording of the
  // literature's passkey prompt that SmolLM2-135M-Instruct answers in fp16 (docs/metrics.md,
  // "Retrieval": with the literature's own wording it describes a key instead of quoting it).
  std::string intro = "Read the text below and remember the pass key in it.\n\n";
  std::string needle = "\nThe pass key is {key}.\n";
  std::string question = "\n\nWhat is the pass key in the text above?";
  std::string answer_prefix = "The pass key in the text is";
};

// Induction copy: a random span, then (`distance` random tokens, the span again) x
// (occurrences - 1).
struct InductionSettings {
  bool enabled = false;
  RetrievalModel model;
  std::vector<int> spans = {16, 32};
  std::vector<int> distances = {64, 512};
  int prefix = 16;      // random tokens before the first occurrence
  int occurrences = 2;  // the span and its copies, `distance` apart; the last copy is scored
  int trials = 4;
  int token_lo = 3;  // span tokens are drawn from [token_lo, token_hi)
  int token_hi = 0;  // 0: the model's vocab_size
};

// Tokens of one induction sequence of this span and distance.
inline std::int64_t induction_tokens(const InductionSettings& s, int span, int distance) {
  return s.prefix + static_cast<std::int64_t>(s.occurrences) * span +
         static_cast<std::int64_t>(s.occurrences - 1) * distance;
}

struct RetrievalSettings {
  bool enabled = false;
  int block = 128;  // pseudo-decode block of the prompt (tokens per forward call)
  std::string current_token = "exact";
  std::int64_t seed = 0;
  std::string device = "cpu";
  int threads = 0;  // CPU intra-op threads; 0: torch's default (not hashed)
  PasskeySettings passkey;
  InductionSettings induction;
};

}  // namespace kvarn

#endif  // KVARN_SWEEPS_CONFIG_RETRIEVAL_HPP_
