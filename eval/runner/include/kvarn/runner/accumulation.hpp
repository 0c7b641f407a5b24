// Error accumulation with the quantizer inside the model loop (docs/metrics.md,
// "Error accumulation"). Three protocols, each against an fp16 reference run of the same model:
//
//  * pseudo-decode (the KVarN paper's protocol): the context is prefilled in blocks of b tokens;
//    each block attends to the method's cache and then writes its fresh K/V into it (quantized by
//    the method's own policy), so layer l's error perturbs layer l+1's K/V before they are
//    quantized, and every later block runs on that perturbed cache ("accumulated"). "Static" runs
//    the same blocks over the *final* cache the method makes from the fp16 run's exact K/V
//    (quantize once after an fp16 prefill). Per block and attention layer: MAE and NMSE of the
//    layer's attention output (after o_proj) against the fp16 run.
//  * teacher-forced decode: after the context, the fp16 run's greedy tokens are fed one at a time
//    through the method's cache: per step KL(p_fp16 || p_method) of the next-token distribution,
//    top-1 agreement, hidden-state drift per layer ||h_q - h_ref|| / ||h_ref||.
//  * free-running decode: greedy, and seeded top-p sampling whose uniform draws are shared with
//    the reference (coupled), for N steps: first divergence, token agreement, and per-step KL while
//    the two prefixes still agree.
//
// The fp16 reference is the runner with an `exact_fp16` cache (bit-identical to the `fp16`
// method), run with the same block partition and current-token policy, so the fp16 method gives
// exactly zero error.
//
// Current-token policy (AccumulationOptions::current_token, config key
// accumulation.current_token): `exact` (ChunkAttention::kExact; KIVI's and KVarN's kernels) lets
// the chunk being run attend to its own exact K/V and quantizes it when written afterwards;
// `quantized` (ChunkAttention::kCache; vLLM's TurboQuant and FP8 decode) writes the chunk first
// and reads every token back as stored. It applies to the accumulated pseudo-decode and to both
// decode protocols. The static baseline's block reads its own K/V exact (`exact`) or, under
// `quantized`, as an fp16 cache stores them, over the final cache's reconstruction held in fp16.
// This header is torch-free (kvarn_runner).
#ifndef KVARN_RUNNER_ACCUMULATION_HPP_
#define KVARN_RUNNER_ACCUMULATION_HPP_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvarn/core/method.hpp"
#include "kvarn/runner/model.hpp"

namespace kvarn {

struct AccumulationOptions {
  int block = 32;         // pseudo-decode block (tokens per forward call)
  int context = 512;      // tokens before decoding: the prompt, continued greedily by fp16
  int decode_steps = 64;  // teacher-forced and free-running steps after the context
  bool pseudo_decode = true, teacher_forced = true, free_running = true;
  // Pseudo-decode also replays every block against the final quantized cache (the static side
  // of "static vs accumulated"); off: accumulated only, half the pseudo-decode's forward work.
  bool static_replay = true;
  std::uint64_t seed = 0;    // sampled free-running run
  double temperature = 0.6;  // sampled run; <= 0: greedy only
  double top_p = 0.95;
  ChunkAttention current_token = ChunkAttention::kExact;
};

// "exact" / "quantized" (config and record spelling) <-> ChunkAttention; parse throws
// kvarn::Error naming the valid values.
std::string current_token_name(ChunkAttention policy);
ChunkAttention parse_current_token(const std::string& name);

// The fp16 run of one prompt; computed once and reused for every method.
struct AccumulationReference {
  // The current-token policy it was run with.
  ChunkAttention current_token = ChunkAttention::kExact;
  int prompt_tokens = 0;                     // tokens of the prompt within the context
  std::vector<std::int32_t> context;         // [context]: prompt + fp16 greedy continuation
  std::vector<Matrix> attention;             // [layers] of [context, hidden] (pseudo-decode)
  std::vector<Matrix> keys, values;          // [layers * kv_heads] of [context, head_dim]
  std::vector<std::int32_t> greedy_tokens;   // [decode_steps]
  Matrix greedy_logits;                      // [decode_steps, vocab]
  std::vector<Matrix> greedy_hidden;         // [decode_steps] of [layers, hidden]
  std::vector<std::int32_t> sampled_tokens;  // [decode_steps] when temperature > 0
  Matrix sampled_logits;
};

AccumulationReference accumulation_reference(const Model& model,
                                             std::span<const std::int32_t> prompt,
                                             const AccumulationOptions& options);

struct PseudoDecodeResult {
  std::vector<int> context_len;  // [blocks]: tokens in the context at each block's end
  // [blocks][layers]; MAE = mean |a_q - a_ref|, NMSE = sum (a_q - a_ref)^2 / sum a_ref^2 over the
  // block's tokens and the hidden dimension of the layer's attention output.
  std::vector<std::vector<double>> mae_accumulated, nmse_accumulated, mae_static, nmse_static;
  // The static side was run (AccumulationOptions::static_replay): mae_static / nmse_static hold a
  // row per block.
  bool has_static() const { return !mae_static.empty(); }
};

struct TeacherForcedResult {
  std::vector<double> kl;                         // [steps], nats
  std::vector<double> top1;                       // [steps], 1 when argmax agrees
  std::vector<std::vector<double>> hidden_drift;  // [steps][layers]
};

struct FreeRunResult {
  std::vector<std::int32_t> tokens_ref, tokens;  // [steps]
  int first_divergence = 0;                      // first differing step; steps when none
  double token_agreement = 0;                    // fraction of steps with equal tokens
  std::vector<double> kl;  // [steps]; NaN after the first divergence (prefixes differ)
};

struct AccumulationResult {
  std::string method;  // the spec run
  ChunkAttention current_token = ChunkAttention::kExact;
  bool has_pseudo = false, has_teacher = false, has_greedy = false, has_sampled = false;
  PseudoDecodeResult pseudo;
  TeacherForcedResult teacher;
  FreeRunResult greedy, sampled;
};

// Runs every enabled protocol for one method spec ("fp16", "kivi_2bit", ...) against `ref`.
AccumulationResult run_accumulation(const Model& model, const AccumulationReference& ref,
                                    const std::string& method_spec,
                                    const AccumulationOptions& options);

// KL(p || q) in nats of softmax(p_logits) and softmax(q_logits), in double; rounding below zero is
// clamped to 0.
double next_token_kl(std::span<const float> p_logits, std::span<const float> q_logits);

// Seeded top-p sampling from logits / temperature with one uniform u in [0, 1): the smallest set
// of most likely tokens (ties by id) whose mass reaches top_p, renormalized, inverse CDF at u.
std::int32_t sample_top_p(std::span<const float> logits, double temperature, double top_p,
                          double u);

// Scalar summaries (docs/results.md): accumulation.mae_accumulated.final, decode.kl.mean, ...;
// layer means of the last block, step means of the decode runs.
std::vector<std::pair<std::string, double>> accumulation_summary(const AccumulationResult& r);

// Per-step / per-block arrays and summaries as JSON (nlohmann), for records and tests.
nlohmann::json to_json(const AccumulationResult& r);

// Mean of the finite entries (NaN marks "undefined" in the arrays); NaN when none is finite.
double finite_mean(const std::vector<double>& v);

}  // namespace kvarn

#endif  // KVARN_RUNNER_ACCUMULATION_HPP_
