// config.json of an HF checkpoint -> ModelConfig (transformers 4.x and 5.x spellings).
#include <fstream>
#include <nlohmann/json.hpp>

#include "kvarn/data/error.hpp"
#include "kvarn/data/read_file.hpp"
#include "kvarn/runner/model.hpp"

namespace kvarn {
namespace {

using nlohmann::json;

// config.json is a few KB; 16 MiB leaves room for any real one and bounds what is read.
constexpr std::uintmax_t kMaxJsonBytes = std::uintmax_t{16} << 20;

struct Reader {
  const json& j;
  std::string file;

  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }
  int get_int(const char* key, std::optional<int> fallback = std::nullopt) const {
    return get_int(j, key, fallback);
  }
  int get_int(const json& obj, const char* key, std::optional<int> fallback) const {
    if (!obj.contains(key) || obj[key].is_null()) {
      KVARN_CHECK(fallback.has_value(), file, ": missing '", key, "'");
      return *fallback;
    }
    KVARN_CHECK(obj[key].is_number_integer(), file, ": '", key, "' must be an integer, got ",
                obj[key].dump());
    const auto v = obj[key].get<std::int64_t>();
    KVARN_CHECK(v >= 0 && v <= (1ll << 31) - 1, file, ": '", key, "' = ", v, " is out of range");
    return static_cast<int>(v);
  }
  double get_double(const json& obj, const char* key, std::optional<double> fallback) const {
    if (!obj.contains(key) || obj[key].is_null()) {
      KVARN_CHECK(fallback.has_value(), file, ": missing '", key, "'");
      return *fallback;
    }
    KVARN_CHECK(obj[key].is_number(), file, ": '", key, "' must be a number, got ",
                obj[key].dump());
    return obj[key].get<double>();
  }
  bool get_bool(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    KVARN_CHECK(j[key].is_boolean(), file, ": '", key, "' must be true or false");
    return j[key].get<bool>();
  }
  std::string get_string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    KVARN_CHECK(j[key].is_string(), file, ": '", key, "' must be a string");
    return j[key].get<std::string>();
  }
};

const char* const kArchitectures[][2] = {{"LlamaForCausalLM", "llama"},
                                         {"Qwen2ForCausalLM", "qwen2"},
                                         {"Qwen3ForCausalLM", "qwen3"},
                                         {"MistralForCausalLM", "mistral"}};

RopeConfig parse_rope(const Reader& r) {
  RopeConfig rope;
  const std::string& file = r.file;
  json params = json::object();
  if (r.has("rope_parameters")) {  // transformers 5
    params = r.j["rope_parameters"];
    KVARN_CHECK(params.is_object(), file, ": 'rope_parameters' must be an object");
    KVARN_CHECK(!params.contains("full_attention") && !params.contains("sliding_attention"), file,
                ": per-layer-type rope_parameters are not supported");
  } else if (r.has("rope_scaling")) {  // transformers 4
    params = r.j["rope_scaling"];
    KVARN_CHECK(params.is_object(), file, ": 'rope_scaling' must be an object or null");
  }
  rope.theta = r.get_double(params, "rope_theta", r.get_double(r.j, "rope_theta", 10000.0));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (params.contains(key) && params[key].is_string()) {
      type = params[key].get<std::string>();
      break;
    }
  }
  const double partial = r.get_double(params, "partial_rotary_factor",
                                      r.get_double(r.j, "partial_rotary_factor", 1.0));
  KVARN_CHECK(partial == 1.0, file, ": partial_rotary_factor ", partial, " is not supported");
  rope.type = type;
  if (type == "default") {
  } else if (type == "linear") {
    rope.factor = r.get_double(params, "factor", std::nullopt);
  } else if (type == "llama3") {
    rope.factor = r.get_double(params, "factor", std::nullopt);
    rope.low_freq_factor = r.get_double(params, "low_freq_factor", std::nullopt);
    rope.high_freq_factor = r.get_double(params, "high_freq_factor", std::nullopt);
    rope.original_max_position_embeddings = r.get_int(
        params, "original_max_position_embeddings", r.get_int("max_position_embeddings", 2048));
    KVARN_CHECK(rope.high_freq_factor != rope.low_freq_factor, file,
                ": llama3 RoPE needs high_freq_factor != low_freq_factor");
  } else {
    fail(file, ": RoPE type '", type, "' is not supported (default, linear, llama3)");
  }
  KVARN_CHECK(rope.theta > 0 && rope.factor > 0, file, ": RoPE theta and factor must be positive");
  return rope;
}

}  // namespace

namespace {

// architectures / model_type: one of kArchitectures, and consistent.
void parse_architecture(const Reader& r, const json& j, const std::string& file, ModelConfig& c) {
  c.model_type = r.get_string("model_type", "");
  if (r.has("architectures")) {
    KVARN_CHECK(j["architectures"].is_array() && !j["architectures"].empty() &&
                    j["architectures"][0].is_string(),
                file, ": 'architectures' must be a non-empty list of names");
    c.architecture = j["architectures"][0].get<std::string>();
  }
  std::string expected_type;
  for (const auto& [arch, type] : kArchitectures) {
    if (c.architecture.empty() && c.model_type == type) c.architecture = arch;
    if (c.architecture == arch) expected_type = type;
  }
  KVARN_CHECK(!expected_type.empty(), file, ": architecture '",
              c.architecture.empty() ? c.model_type : c.architecture,
              "' is not supported (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
              "MistralForCausalLM)");
  if (c.model_type.empty()) c.model_type = expected_type;
  KVARN_CHECK(c.model_type == expected_type, file, ": model_type '", c.model_type,
              "' does not match architecture ", c.architecture);
}

// Sliding-window attention: Mistral applies it to every layer; Qwen2/3 per layer_types (or
// use_sliding_window from max_window_layers on, as transformers derives layer_types).
void parse_sliding_layers(const Reader& r, const json& j, const std::string& file, ModelConfig& c) {
  c.sliding_layers.assign(c.num_layers, false);
  const int window = r.get_int("sliding_window", 0);
  if (c.model_type == "mistral") {
    c.sliding_layers.assign(c.num_layers, window > 0);
  } else if (r.has("layer_types")) {
    const auto& lt = j["layer_types"];
    KVARN_CHECK(lt.is_array() && static_cast<int>(lt.size()) == c.num_layers, file,
                ": 'layer_types' must list ", c.num_layers, " layers");
    for (int l = 0; l < c.num_layers; ++l) {
      const auto t = lt[l].is_string() ? lt[l].get<std::string>() : std::string();
      KVARN_CHECK(t == "full_attention" || t == "sliding_attention", file, ": layer_types[", l,
                  "] = ", lt[l].dump(), " is not supported");
      c.sliding_layers[l] = t == "sliding_attention";
    }
  } else if (r.get_bool("use_sliding_window", false)) {
    const int from = r.get_int("max_window_layers", c.num_layers);
    for (int l = from; l < c.num_layers; ++l) c.sliding_layers[l] = true;
  }
  for (bool s : c.sliding_layers) {
    KVARN_CHECK(!s || window > 0, file, ": sliding-window layers need a positive sliding_window");
  }
  bool any_sliding = false;
  for (bool s : c.sliding_layers) any_sliding = any_sliding || s;
  c.sliding_window = any_sliding ? window : 0;
}

void parse_special_tokens(const Reader& r, const json& j, const std::string& file, ModelConfig& c) {
  c.bos_token_id = r.has("bos_token_id") ? r.get_int("bos_token_id") : -1;
  if (r.has("eos_token_id")) {
    const auto& e = j["eos_token_id"];
    if (e.is_array()) {
      for (const auto& x : e) {
        KVARN_CHECK(x.is_number_integer(), file, ": eos_token_id entries must be integers");
        c.eos_token_ids.push_back(x.get<int>());
      }
    } else {
      c.eos_token_ids.push_back(r.get_int("eos_token_id"));
    }
  }
}

// Positive, and not far beyond any supported model: sizes that are damage are rejected before
// anything is sized by them.
void check_sizes(const ModelConfig& c, const std::string& file) {
  KVARN_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 &&
                  c.num_layers > 0 && c.num_heads > 0 && c.num_kv_heads > 0,
              file, ": sizes must be positive");
  KVARN_CHECK(c.num_layers <= 4096 && c.num_heads <= 4096 && c.num_kv_heads <= 4096 &&
                  c.hidden_size <= (1 << 20) && c.intermediate_size <= (1 << 22) &&
                  c.vocab_size <= (1 << 24),
              file, ": sizes (num_hidden_layers ", c.num_layers, ", num_attention_heads ",
              c.num_heads, ", num_key_value_heads ", c.num_kv_heads, ", hidden_size ",
              c.hidden_size, ", intermediate_size ", c.intermediate_size, ", vocab_size ",
              c.vocab_size, ") exceed the supported maxima (4096, 4096, 4096, 2^20, 2^22, 2^24)");
}

}  // namespace

ModelConfig load_model_config(const std::filesystem::path& path) {
  const std::string file = path.string();
  KVARN_CHECK(std::filesystem::exists(path), file,
              ": cannot read model config (missing config.json?)");
  const std::string text = read_regular_file(path, "model config (config.json)", kMaxJsonBytes);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(file, ": corrupt config (invalid JSON): ", without_tag(e.what()));
  }
  KVARN_CHECK(j.is_object(), file, ": config is not a JSON object");
  Reader r{j, file};
  ModelConfig c;
  c.path = path;
  parse_architecture(r, j, file, c);

  c.vocab_size = r.get_int("vocab_size");
  c.hidden_size = r.get_int("hidden_size");
  c.intermediate_size = r.get_int("intermediate_size");
  c.num_layers = r.get_int("num_hidden_layers");
  c.num_heads = r.get_int("num_attention_heads");
  c.num_kv_heads = r.get_int("num_key_value_heads", c.num_heads);
  check_sizes(c, file);
  c.head_dim = r.get_int("head_dim", c.hidden_size / c.num_heads);
  KVARN_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0 && c.head_dim <= 4096, file, ": head_dim ",
              c.head_dim, " must be positive, even and at most 4096");
  KVARN_CHECK(c.num_heads % c.num_kv_heads == 0, file, ": num_attention_heads ", c.num_heads,
              " is not a multiple of num_key_value_heads ", c.num_kv_heads);
  c.max_position_embeddings = r.get_int("max_position_embeddings", 2048);
  c.rms_norm_eps = r.get_double(j, "rms_norm_eps", 1e-6);
  const std::string act = r.get_string("hidden_act", r.get_string("hidden_activation", "silu"));
  KVARN_CHECK(act == "silu", file, ": hidden_act '", act, "' is not supported (silu)");
  c.rope = parse_rope(r);
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  if (c.model_type == "qwen2") {
    c.qkv_bias = true;
  } else if (c.model_type == "llama" || c.model_type == "qwen3") {
    c.qkv_bias = c.o_bias = r.get_bool("attention_bias", false);
  }
  if (c.model_type == "llama") c.mlp_bias = r.get_bool("mlp_bias", false);
  c.qk_norm = c.model_type == "qwen3";

  parse_sliding_layers(r, j, file, c);

  c.torch_dtype = r.get_string("torch_dtype", r.get_string("dtype", ""));
  parse_special_tokens(r, j, file, c);
  return c;
}

}  // namespace kvarn
