// Sweep configs (YAML, schema version 1; every key is documented in docs/config-schema.md).
//
// load_config() parses the file, applies `--set key.path=value` overrides, validates every key
// (unknown keys with the nearest valid one, types, files, empty grids, method specs through the
// registry) and resolves the case list. Any problem is one kvarn::Error of the form
//   configs/x.yaml:12:5: key 'metrics.atention': unknown key (nearest: attention)
// and nothing runs. The resolved config is canonical JSON; its SHA-256 names the run directory.
#ifndef KVARN_SWEEPS_CONFIG_HPP_
#define KVARN_SWEEPS_CONFIG_HPP_

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kvarn/sweeps/checkpoint_ref.hpp"
#include "kvarn/sweeps/config_quality.hpp"
#include "kvarn/sweeps/config_retrieval.hpp"

namespace kvarn {

inline constexpr int kConfigSchemaVersion = 1;
// Where the engine writes a `data.capture`, relative to the run directory; with a list of
// capture blocks, block i > 0 goes to capture_file(i) ("data/capture_2.h5" for the second).
inline constexpr const char* kCaptureFile = "data/capture.h5";
inline std::string capture_file(std::size_t i) {
  return i == 0 ? std::string(kCaptureFile) : "data/capture_" + std::to_string(i + 1) + ".h5";
}

// One HDF5 tile file (kvarn-tiles v1).
struct TilesSource {
  std::string path;                // as written in the config
  std::filesystem::path resolved;  // where it was found
  std::string name;                // short label used in results ("sample")
  std::string fingerprint;         // file_fingerprint()
  int head_dim = 0;
  // What the config checks need from the file, read once when the config is loaded.
  int num_sequences = 0, num_captured_layers = 0, num_kv_heads = 0;
  bool has_queries = false;  // some sequence has captured queries
};

// `data.capture` (or `data.fallback.capture`, or one block of a list of them) with a local
// checkpoint: the engine captures real KV with kvarn::run_capture into <run_dir>/capture_file(i)
// before the cases run (sweeps/src/capture_step.cpp). Everything here was checked against the
// checkpoint at load time.
struct CaptureSpec {
  std::string key;                       // "data.capture[.i]" or "data.fallback.capture[.i]"
  std::string model;                     // as written
  std::filesystem::path model_resolved;  // checkpoint directory (has config.json)
  std::string name;                      // the `data` label of its results (directory name)
  std::string prompts;                   // JSONL as written
  std::filesystem::path prompts_resolved;
  std::vector<std::string> prompt_ids;  // empty: every prompt, in file order
  int generate = 0, max_tokens = 0;
  bool ignore_eos = false, chat = false;
  std::string layers = "all", kv_heads = "all", query_heads = "all";  // capture's index lists
  std::string device = "cpu";
  int threads = 0;  // CPU intra-op threads (0: torch's default); not part of the hash
  // From the checkpoint and the prompts (validate's estimate, index and head_dim checks).
  int head_dim = 0, num_layers = 0, num_kv_heads = 0, num_q_heads = 0;
  int captured_layers = 0, captured_q_heads = 0;
  std::vector<int> sequence_tokens;  // per captured sequence (prompt + generated, capped)
  double weight_bytes = 0;
  // Canonical spec (model and prompt fingerprints included): part of the run hash and recorded
  // in the capture file, which is reused only when its recorded spec hash matches.
  nlohmann::json resolved;
  std::string hash;  // sha256_hex(resolved.dump())
};

struct DataSelection {
  std::vector<TilesSource> tiles;
  // Captured at run time, in this order, each measured before `tiles` (e.g. two models: one
  // head_dim each).
  std::vector<CaptureSpec> captures;
  std::optional<std::vector<int>> sequences, layers, kv_heads;  // nullopt: all
  int max_tokens = 0;                                           // 0: every token
  std::string source = "tiles";                                 // "tiles", "capture" or "fallback"
};

// One resolved case: a method the registry builds.
struct CaseSpec {
  int index = 0;
  std::string id;     // "c003-1a2b3c4d": index + first 8 hex of sha256(spec)
  std::string input;  // as written (a preset name, a spec, or the spec a grid produced)
  std::string name;   // Method::name()
  std::string spec;   // Method::spec(), canonical; cases are deduplicated on it
  std::string family;
  double bits_per_element = 0;  // at the first tile file's head_dim
};

struct MetricsSelection {
  bool reconstruction = true;
  bool attention = true;
  std::vector<double> outlier_percents = {0.1, 1.0, 5.0};
  std::vector<int> topk = {1, 8, 32};
  bool arrays = true;          // per-position / per-channel arrays in arrays/<case>.h5
  std::string device = "cpu";  // attention metrics on "cpu" or "cuda" (kvarn_cuda)
  int threads = 0;             // CPU attention-metric threads (0: OpenMP's default), not hashed
};

// `accumulation:` (docs/config-schema.md): the model runner with each case's method in the loop.
struct AccumulationModel : CheckpointRef {
  double weight_bytes = 0;  // safetensors bytes (the estimate's size proxy)
};

struct AccumulationSettings {
  bool enabled = false;
  std::vector<AccumulationModel> models;
  std::string prompts;  // JSONL file as written
  std::filesystem::path prompts_resolved;
  std::vector<std::string> prompt_ids;    // resolved (default: the file's first prompt)
  std::vector<std::string> prompt_texts;  // same order ("" for a token-id prompt)
  std::vector<std::vector<std::int32_t>> prompt_token_ids;  // same order; empty: a text prompt
  int block = 32, context = 512, decode_steps = 64;
  bool pseudo_decode = true, teacher_forced = true, free_running = true;
  bool static_replay = true;  // pseudo-decode's static side (AccumulationOptions::static_replay)
  double temperature = 0.6, top_p = 0.95;  // sampled free-running run (temperature 0: none)
  std::int64_t seed = 0;
  std::string device = "cpu";
  int threads = 0;  // CPU intra-op threads; 0: torch's default
  // Current-token policies, each run separately: "exact" (the chunk attends to its own exact
  // K/V) and/or "quantized" (it reads itself back as stored). kvarn/runner/accumulation.hpp.
  std::vector<std::string> current_token = {"exact"};
};

struct SweepConfig {
  std::filesystem::path config_path;  // as given on the command line
  std::string config_text;            // the file as read
  std::vector<std::string> sets;      // --set overrides, in order

  int version = kConfigSchemaVersion;
  std::string name, description;
  DataSelection data;
  std::vector<CaseSpec> cases;
  MetricsSelection metrics;
  AccumulationSettings accumulation;
  QualitySettings quality;         // `quality:` (config_quality.hpp)
  RetrievalSettings retrieval;     // config_retrieval.hpp
  std::string throughput_results;  // "" when none
  std::filesystem::path throughput_resolved;
  std::int64_t seed = 0;
  std::string output = "runs";
  bool report = true;

  std::vector<std::string> notices;  // printed by validate and sweep (fallback data, skips)
  nlohmann::json resolved;           // canonical resolved config (what resolved.json holds)
  std::string hash;                  // sha256_hex(resolved.dump())
};

// Throws kvarn::Error (file:line:col: key 'a.b': message) on any problem.
SweepConfig load_config(const std::filesystem::path& path,
                        const std::vector<std::string>& sets = {});

// Resolves a relative path: CWD, then the config's directory, then its parent (the repo root for
// configs/). Returns "" when not found.
std::filesystem::path resolve_input_path(const std::string& path,
                                         const std::filesystem::path& config_path);

}  // namespace kvarn

#endif  // KVARN_SWEEPS_CONFIG_HPP_
