// A decoder-only transformer from an HF checkpoint directory (config.json + safetensors), run with
// libtorch on CPU or CUDA: LlamaForCausalLM (incl. Llama-3 "llama3" RoPE scaling),
// Qwen2ForCausalLM (q/k/v bias), Qwen3ForCausalLM (per-head q/k RMSNorm before RoPE),
// MistralForCausalLM (sliding window). Numerics follow HF transformers (RMSNorm in fp32,
// rotate_half RoPE, GQA attention with a causal mask and an fp32 softmax, SwiGLU MLP); fp32
// compute by default.
//
// Every forward call runs a chunk of new tokens over an explicit ModelKvCache (kv_cache.hpp) and
// appends the chunk's post-RoPE K/V to it, so prefill, block-wise pseudo-decode, teacher-forced
// and free-running decode are all sequences of forward() calls. This header is torch-free.
#ifndef KVARN_RUNNER_MODEL_HPP_
#define KVARN_RUNNER_MODEL_HPP_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvarn/core/method.hpp"
#include "kvarn/runner/kv_cache.hpp"

namespace kvarn {

struct RopeConfig {
  std::string type = "default";  // "default", "linear", "llama3"
  double theta = 10000.0;
  double factor = 1.0;                                   // linear, llama3
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int original_max_position_embeddings = 0;              // llama3
};

struct ModelConfig {
  std::filesystem::path path;  // config.json it came from
  std::string architecture;    // "LlamaForCausalLM", ...
  std::string model_type;      // "llama", "qwen2", "qwen3", "mistral"
  int vocab_size = 0, hidden_size = 0, intermediate_size = 0;
  int num_layers = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool qkv_bias = false, o_bias = false, mlp_bias = false;
  bool qk_norm = false;  // Qwen3
  bool tie_word_embeddings = false;
  int sliding_window = 0;            // 0: none
  std::vector<bool> sliding_layers;  // per layer: uses the sliding window
  std::string torch_dtype;           // as stored ("float16", "bfloat16", "float32", "")
  std::vector<int> eos_token_ids;
  int bos_token_id = -1;
  KvGeometry kv_geometry() const { return {num_layers, num_kv_heads, head_dim}; }
};

// Parses and validates config.json; unsupported architectures, activations, RoPE types and
// inconsistent sizes are errors naming the file.
ModelConfig load_model_config(const std::filesystem::path& config_json);

struct LoadOptions {
  std::string device = "cpu";     // "cpu", "cuda", "cuda:1"
  std::string dtype = "float32";  // compute dtype: "float32" (default), "float16", "bfloat16"
  int num_threads = 0;            // CPU intra-op threads; 0 = torch's default
};

enum class LogitsMode { kNone, kLast, kAll };

// How the chunk being processed attends to itself. kExact (default; KIVI, KVarN and vLLM
// kernels do this): its queries see the cache's stored rows for earlier tokens and the chunk's own
// exact K/V; the chunk is quantized when written afterwards. kCache: the chunk is written first
// and attention reads back the cache for every token, the chunk's own included.
enum class ChunkAttention { kExact, kCache };

// What one layer computed for the chunk, for capture. Per head [n, head_dim] matrices.
struct LayerCapture {
  int layer = 0;
  int first_position = 0;
  int tokens = 0;
  std::vector<Matrix> q;           // post-RoPE queries, [num_heads]
  std::vector<Matrix> k_pre_rope;  // [num_kv_heads]
  std::vector<Matrix> k;           // post-RoPE keys as computed (before the cache)
  std::vector<Matrix> v;
};

struct ForwardOptions {
  LogitsMode logits = LogitsMode::kLast;
  ChunkAttention chunk_attention = ChunkAttention::kExact;
  bool hidden_states = false;      // residual stream after each decoder layer, [n, hidden]
  bool attention_outputs = false;  // each layer's attention output (after o_proj), [n, hidden]
  std::function<void(const LayerCapture&)> capture;  // called once per layer when set
};

struct ForwardResult {
  int first_position = 0;
  int tokens = 0;
  Matrix logits;                          // [0 | 1 | tokens, vocab] (fp32)
  std::vector<Matrix> hidden_states;      // [num_layers] of [tokens, hidden] when requested
  std::vector<Matrix> attention_outputs;  // [num_layers] of [tokens, hidden] when requested
};

class Model {
 public:
  // Loads config.json and the safetensors weights (fp32/fp16/bf16) of an HF checkpoint dir.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir,
                                     const LoadOptions& options = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const;
  const std::filesystem::path& dir() const;
  std::string device() const;  // "cpu", "cuda:0"
  bool on_cuda() const;
  // "exact", "exact_fp16" or a registry method name/spec (see ModelKvCache).
  ModelKvCache make_cache(const std::string& spec = "exact") const;

  // Runs `tokens` at positions cache.size() .. cache.size() + n - 1 and appends their K/V.
  ForwardResult forward(ModelKvCache& cache, std::span<const std::int32_t> tokens,
                        const ForwardOptions& options = {}) const;
  // Convenience: next-token logits [vocab] after the prompt / after one more token.
  std::vector<float> prefill(ModelKvCache& cache, std::span<const std::int32_t> tokens) const;
  std::vector<float> decode_step(ModelKvCache& cache, std::int32_t token) const;
  // Greedy decoding of `steps` tokens after `prompt` (stops early at an EOS id when stop_at_eos).
  std::vector<std::int32_t> generate_greedy(ModelKvCache& cache,
                                            std::span<const std::int32_t> prompt, int steps,
                                            bool stop_at_eos = false) const;

 private:
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Index of the largest logit (the first one on ties, as torch.argmax).
int argmax(std::span<const float> logits);

}  // namespace kvarn

#endif  // KVARN_RUNNER_MODEL_HPP_
