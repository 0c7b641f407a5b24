// Capture of real KV tiles (`kvarn-eval capture`, docs/hdf5-schema.md "kvarn-tiles" v1): runs
// prompts through the runner (optionally continuing each greedily), records per selected layer the
// post-RoPE queries, pre- and post-RoPE keys and values of one prefill pass over the whole
// sequence, checks them, and streams one sequence at a time into a TileWriter (temporary file,
// renamed on success). Every input is validated before the output file is created, so bad input
// never leaves a file behind.
//
// Checks per sequence and captured layer (the same as scripts/capture_tiles.py):
//   * captured post-RoPE K and V equal the rows the exact cache stored (bit for bit);
//   * RoPE applied in double precision to the captured pre-RoPE K equals the post-RoPE K within
//     the fp32 rounding of the angle (see rope_tolerance in capture.cpp).
// This header is torch-free.
#ifndef KVARN_RUNNER_CAPTURE_HPP_
#define KVARN_RUNNER_CAPTURE_HPP_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvarn {

// One JSONL line: {"id": ..., "text": "..."} or {"id": ..., "token_ids": [...]}.
struct CapturePrompt {
  std::string id;
  std::string text;
  std::vector<std::int32_t> token_ids;
  bool has_token_ids = false;
  int line = 0;  // 1-based line in the file (for errors)
};

// Parses a prompts file; malformed lines are errors naming file:line. `ids` (may be empty =
// all) selects and orders prompts; unknown ids are an error listing them.
std::vector<CapturePrompt> load_capture_prompts(const std::filesystem::path& path,
                                                const std::vector<std::string>& ids = {});

// "all" -> 0..n-1; "0,3,7", "0-3", "1,4-6" -> the list; out-of-range, duplicates, empty and
// malformed entries are errors naming `what` (e.g. "--layers").
std::vector<int> parse_index_list(const std::string& spec, int n, const std::string& what);

struct CaptureOptions {
  std::filesystem::path model_dir, prompts, out;
  std::vector<std::string> ids;  // prompt ids to use (default: all, in file order)
  std::string layers = "all", kv_heads = "all", query_heads = "all";
  int max_tokens = 0;  // truncate each sequence to N tokens (0: no limit)
  int generate = 0;    // greedy continuation tokens before the capture pass
  bool ignore_eos = false;
  bool chat = false;    // wrap each text prompt in the model's ChatML chat template
  bool concat = false;  // all prompts form one sequence (texts joined with "\n\n")
  bool force = false;   // overwrite --out
  bool pre_rope = true, q = true;
  bool compress = false;  // gzip the fp16 datasets (TileCompression::kGzip)
  std::string device = "cpu";
  int num_threads = 0;
  std::string model_name;  // root attribute `model` (default: the model directory's name)
  std::string source;      // root attribute `source` (default: derived from the model dir)
  // Provenance supplied by the caller (tool, version, git commit, command line, build); the
  // capture adds model, prompts, settings, generation and checks.
  nlohmann::json provenance = nlohmann::json::object();
  // Hex SHA-256 of a file (the CLI passes the sweeps implementation); empty -> not recorded.
  std::function<std::string(const std::filesystem::path&)> sha256_file;
  std::function<void(const std::string&)> log;  // progress lines; may be empty
  std::function<bool()> cancelled;  // polled between layers; true -> abort, nothing written
};

struct CaptureCheck {
  int sequence = 0;
  double k_vs_cache = 0, v_vs_cache = 0;  // max |captured - cache row|
  double rope_pre_vs_post = 0;            // max |RoPE(k_pre) - k| (double RoPE vs fp32 runner)
  double rope_worst_ratio = 0;            // max |diff| / tolerance (must be <= 1)
};

struct CaptureResult {
  std::filesystem::path out;
  int sequences = 0;
  std::vector<int> num_tokens;
  std::vector<CaptureCheck> checks;
  std::uintmax_t bytes = 0;
};

// Runs the whole capture. Throws kvarn::Error (one clear message) on bad input or a failed
// check; then no output file exists (an existing --out is left untouched).
CaptureResult run_capture(const CaptureOptions& options);

// Renders a ChatML chat template (<|im_start|>role\n...<|im_end|>\n, with the template's default
// system message when it has one) for one user message plus the assistant generation prompt.
// Other templates are an error naming tokenizer_config.json.
std::string render_chat_prompt(const std::filesystem::path& model_dir, const std::string& text);

class Tokenizer;
// Token ids of a text prompt exactly as the capture feeds it: through the chat template (its
// special tokens are in the template) or as tokenizer(text) in transformers (post-processor
// applied; `concat` appends the "\n\n" that separates concatenated prompts). The sweep's
// context check uses this too, so its token counts are the capture's.
std::vector<std::int32_t> encode_capture_prompt(const Tokenizer& tokenizer,
                                                const std::filesystem::path& model_dir,
                                                const std::string& text, bool chat,
                                                bool concat = false);

}  // namespace kvarn

#endif  // KVARN_RUNNER_CAPTURE_HPP_
