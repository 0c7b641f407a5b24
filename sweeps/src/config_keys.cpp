// The sweep config key table (docs/config-schema.md documents the same keys; a test checks it).
#include "kvarn/sweeps/config_keys.hpp"

#include <array>

#include "kvarn/data/error.hpp"

namespace kvarn {

namespace {

using T = KeyType;

constexpr std::array kKeys = {
    // Top level.
    ConfigKey{"", "version", T::kInt, 0, kIntMax, "required", "schema version; only 1 exists"},
    ConfigKey{"", "name", T::kString, 0, 0, "required", "names the run directory"},
    ConfigKey{"", "description", T::kString, 0, 0, "\"\"", "free text, not hashed"},
    ConfigKey{"", "data", T::kMapping, 0, 0, "required", "what to measure on"},
    ConfigKey{"", "methods", T::kList, 0, 0, "required", "names, specs and grids"},
    ConfigKey{"", "metrics", T::kMapping, 0, 0, "all on", "which metric families"},
    ConfigKey{"", "accumulation", T::kMapping, 0, 0, "{enabled: false}", "model in the loop"},
    ConfigKey{"", "retrieval", T::kMapping, 0, 0, "{enabled: false}", "passkey, induction copy"},
    ConfigKey{"", "throughput", T::kMapping, 0, 0, "{results: null}", "GPU benchmark results"},
    ConfigKey{"", "quality", T::kMapping, 0, 0, "{enabled: false}", "KLD / perplexity vs fp16"},
    ConfigKey{"", "seed", T::kInt, 0, kInt64Max, "0", "recorded seed"},
    ConfigKey{"", "output", T::kString, 0, 0, "runs", "parent of run directories, not hashed"},
    ConfigKey{"", "report", T::kBool, 0, 0, "true", "run the report at the end"},
    // data (and data.fallback, without `fallback`).
    ConfigKey{"data", "tiles", T::kStrings, 0, 0, "required unless capture", "HDF5 tile files"},
    ConfigKey{"data", "sequences", T::kSelection, 0, kIntMax, "all", "sequence indices"},
    ConfigKey{"data", "layers", T::kSelection, 0, kIntMax, "all", "captured-layer indices"},
    ConfigKey{"data", "kv_heads", T::kSelection, 0, kIntMax, "all", "KV head indices"},
    ConfigKey{"data", "max_tokens", T::kInt, 0, kIntMax, "0", "first N tokens; 0 = all"},
    ConfigKey{"data", "capture", T::kMapping, 0, 0, "absent", "capture(s) from local checkpoints"},
    ConfigKey{"data", "fallback", T::kMapping, 0, 0, "absent", "data when the model is a hub id"},
    // data.capture (and data.fallback.capture).
    ConfigKey{"data.capture", "model", T::kString, 0, 0, "required", "checkpoint or hub id"},
    ConfigKey{"data.capture", "prompts", T::kString, 0, 0, "required", "JSONL prompts file"},
    ConfigKey{"data.capture", "prompt_ids", T::kStringList, 0, 0, "every prompt", "which prompts"},
    ConfigKey{"data.capture", "generate", T::kInt, 0, 1 << 22, "0", "greedy tokens generated"},
    ConfigKey{"data.capture", "ignore_eos", T::kBool, 0, 0, "false", "generate past EOS"},
    ConfigKey{"data.capture", "max_tokens", T::kInt, 0, 1 << 24, "0", "truncate; 0 = no limit"},
    ConfigKey{"data.capture", "layers", T::kIndexList, 0, kIntMax, "all", "model layers"},
    ConfigKey{"data.capture", "kv_heads", T::kIndexList, 0, kIntMax, "all", "must be all"},
    ConfigKey{"data.capture", "query_heads", T::kIndexList, 0, kIntMax, "all", "query heads"},
    ConfigKey{"data.capture", "chat", T::kBool, 0, 0, "false", "ChatML template for text"},
    ConfigKey{"data.capture", "device", T::kString, 0, 0, "cpu", "cpu, cuda or cuda:N"},
    ConfigKey{"data.capture", "threads", T::kInt, 0, 1024, "0", "CPU threads, not hashed"},
    // metrics.
    ConfigKey{"metrics", "reconstruction", T::kBool, 0, 0, "true", "K/V reconstruction error"},
    ConfigKey{"metrics", "attention", T::kBool, 0, 0, "true", "attention metrics"},
    ConfigKey{"metrics", "outlier_fractions", T::kNumberList, 0, 0, "[0.1, 1, 5]", "percents"},
    ConfigKey{"metrics", "topk", T::kIntList, 1, kIntMax, "[1, 8, 32]", "top-k overlap levels"},
    ConfigKey{"metrics", "arrays", T::kBool, 0, 0, "true", "write arrays/<case>.h5"},
    ConfigKey{"metrics", "device", T::kString, 0, 0, "cpu", "cpu or cuda"},
    ConfigKey{"metrics", "threads", T::kInt, 0, 1024, "0", "CPU threads, not hashed"},
    // accumulation.
    ConfigKey{"accumulation", "enabled", T::kBool, 0, 0, "false", "run the protocols"},
    ConfigKey{"accumulation", "model", T::kStrings, 0, 0, "required", "checkpoint directories"},
    ConfigKey{"accumulation", "prompts", T::kString, 0, 0, "required", "JSONL prompts file"},
    ConfigKey{"accumulation", "prompt_ids", T::kStringList, 0, 0, "first prompt", "which"},
    ConfigKey{"accumulation", "block", T::kInt, 1, 1 << 20, "32", "pseudo-decode block size"},
    ConfigKey{"accumulation", "context", T::kInt, 1, 1 << 22, "512", "context length"},
    ConfigKey{"accumulation", "decode_steps", T::kInt, 1, 1 << 20, "64", "steps after context"},
    ConfigKey{"accumulation", "modes", T::kStringList, 0, 0, "all three", "protocols to run"},
    ConfigKey{"accumulation", "static_replay", T::kBool, 0, 0, "true", "pseudo-decode static side"},
    ConfigKey{"accumulation", "seed", T::kInt, 0, kInt64Max, "0", "sampling seed"},
    ConfigKey{"accumulation", "temperature", T::kNumber, 0, 0, "0.6", "sampled run; 0: none"},
    ConfigKey{"accumulation", "top_p", T::kNumber, 0, 0, "0.95", "nucleus, in (0, 1]"},
    ConfigKey{"accumulation", "device", T::kString, 0, 0, "cpu", "cpu, cuda or cuda:N"},
    ConfigKey{"accumulation", "threads", T::kInt, 0, 1024, "0", "CPU threads, not hashed"},
    ConfigKey{"accumulation", "current_token", T::kStrings, 0, 0, "exact", "exact, quantized"},
    // quality.
    ConfigKey{"quality", "enabled", T::kBool, 0, 0, "false", "run KLD / perplexity"},
    ConfigKey{"quality", "model", T::kStrings, 0, 0, "required", "checkpoint directories"},
    ConfigKey{"quality", "text", T::kString, 0, 0, "required", "UTF-8 held-out text file"},
    ConfigKey{"quality", "window", T::kInt, 2, 1 << 22, "2048", "tokens per window"},
    ConfigKey{"quality", "windows", T::kString, 0, 0, "all", "window count or all"},
    ConfigKey{"quality", "block", T::kInt, 1, 1 << 20, "32", "pseudo-decode block size"},
    ConfigKey{"quality", "current_token", T::kString, 0, 0, "exact", "exact or quantized"},
    ConfigKey{"quality", "bucket", T::kInt, 1, 1 << 22, "512", "position-bucket width"},
    ConfigKey{"quality", "per_layer", T::kBool, 0, 0, "false", "one layer quantized at a time"},
    ConfigKey{"quality", "per_layer_methods", T::kStringList, 0, 0, "every case", "which"},
    ConfigKey{"quality", "per_layer_windows", T::kInt, 1, 1 << 20, "4", "windows per layer"},
    ConfigKey{"quality", "resamples", T::kInt, 10, 1000000, "1000", "bootstrap resamples"},
    ConfigKey{"quality", "device", T::kString, 0, 0, "cpu", "cpu, cuda or cuda:N"},
    ConfigKey{"quality", "threads", T::kInt, 0, 1024, "0", "CPU threads, not hashed"},
    // retrieval (config_retrieval.cpp).
    ConfigKey{"retrieval", "enabled", T::kBool, 0, 0, "false", "run passkey / induction"},
    ConfigKey{"retrieval", "block", T::kInt, 1, 1 << 20, "128", "prompt pseudo-decode block"},
    ConfigKey{"retrieval", "current_token", T::kString, 0, 0, "exact", "exact or quantized"},
    ConfigKey{"retrieval", "seed", T::kInt, 0, kInt64Max, "0", "passkeys and token spans"},
    ConfigKey{"retrieval", "device", T::kString, 0, 0, "cpu", "cpu, cuda or cuda:N"},
    ConfigKey{"retrieval", "threads", T::kInt, 0, 1024, "0", "CPU threads, not hashed"},
    ConfigKey{"retrieval", "passkey", T::kMapping, 0, 0, "off", "needle in a haystack"},
    ConfigKey{"retrieval", "induction", T::kMapping, 0, 0, "off", "copy a random span"},
    ConfigKey{"retrieval.passkey", "enabled", T::kBool, 0, 0, "true", "run it"},
    ConfigKey{"retrieval.passkey", "model", T::kString, 0, 0, "required", "checkpoint directory"},
    ConfigKey{"retrieval.passkey", "filler", T::kString, 0, 0, "required", "haystack text"},
    ConfigKey{"retrieval.passkey", "lengths", T::kIntList, 1, 1 << 22, "[1024, 2048]", "tokens"},
    ConfigKey{"retrieval.passkey", "depths", T::kNumberList, 0, 0, "[0, 0.5, 1]", "in [0, 1]"},
    ConfigKey{"retrieval.passkey", "trials", T::kInt, 1, 1 << 20, "4", "keys per cell"},
    ConfigKey{"retrieval.passkey", "digits", T::kInt, 1, 64, "5", "passkey digits"},
    ConfigKey{"retrieval.passkey", "decode_steps", T::kInt, 1, 1024, "8", "greedy tokens"},
    ConfigKey{"retrieval.passkey", "chat", T::kBool, 0, 0, "true", "ChatML turn"},
    ConfigKey{"retrieval.passkey", "intro", T::kString, 0, 0, "see docs", "before the haystack"},
    ConfigKey{"retrieval.passkey", "needle", T::kString, 0, 0, "see docs", "with {key}"},
    ConfigKey{"retrieval.passkey", "question", T::kString, 0, 0, "see docs", "after it"},
    ConfigKey{"retrieval.passkey", "answer_prefix", T::kString, 0, 0, "see docs", "reply start"},
    ConfigKey{"retrieval.induction", "enabled", T::kBool, 0, 0, "true", "run it"},
    ConfigKey{"retrieval.induction", "model", T::kString, 0, 0, "required", "checkpoint dir"},
    ConfigKey{"retrieval.induction", "spans", T::kIntList, 2, 1 << 20, "[16, 32]", "span tokens"},
    ConfigKey{"retrieval.induction", "distances", T::kIntList, 0, 1 << 22, "[64, 512]", "gap"},
    ConfigKey{"retrieval.induction", "prefix", T::kInt, 0, 1 << 22, "16", "tokens before"},
    ConfigKey{"retrieval.induction", "trials", T::kInt, 1, 1 << 20, "4", "spans per cell"},
    ConfigKey{"retrieval.induction", "token_lo", T::kInt, 0, kIntMax, "3", "smallest token id"},
    ConfigKey{"retrieval.induction", "occurrences", T::kInt, 2, 64, "2", "copies of the span"},
    ConfigKey{"retrieval.induction", "token_hi", T::kInt, 0, kIntMax, "0", "end of ids (0: vocab)"},
    // throughput.
    ConfigKey{"throughput", "results", T::kString, 0, 0, "null", "GPU benchmark JSON"},
};

}  // namespace

std::span<const ConfigKey> config_keys() { return kKeys; }

const ConfigKey& config_key(std::string_view section, std::string_view name) {
  for (const ConfigKey& k : kKeys) {
    if (k.section == section && k.name == name) return k;
  }
  fail("config key table has no key '", section, section.empty() ? "" : ".", name, "'");
}

std::vector<std::string> config_section_keys(std::string_view section) {
  std::vector<std::string> out;
  for (const ConfigKey& k : kKeys) {
    if (k.section == section) out.emplace_back(k.name);
  }
  return out;
}

}  // namespace kvarn
