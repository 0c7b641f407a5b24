// Attention-level error of a method with captured queries: reference attention over the exact K, V
// against attention over the method's reconstruction K̂, V̂ (docs/metrics.md has the formulas).
//
//   GQA: query head h reads KV head h / (Hq / Hkv).  Causal: the query at position t attends to
//   keys 0..t.  Logits s = q·k / sqrt(D), computed and soft-maxed in double. Query row i of a [Tq,
//   D] query matrix sits at position q_first + i (default T - Tq, i.e. the queries of the last Tq
//   tokens; Tq = T gives every position).
//
// The method's cache policy (sink, tail, KIVI residual window, TurboQuant boundary layers) is
// honoured by measuring its reconstruction, fp16-kept tokens included. This is the static view:
// all T tokens are in the cache when the queries read it.
#ifndef KVARN_EVAL_ATTENTION_HPP_
#define KVARN_EVAL_ATTENTION_HPP_

#include <Eigen/Core>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "kvarn/core/attention_ref.hpp"  // MatrixD, the CPU attention reference
#include "kvarn/core/method.hpp"

namespace kvarn {

// Where the per-(head, position) metrics are computed. kCuda: kvarn_cuda's attention_rows
// (double logits on the GPU, same row formulas from kvarn/core/attention_row.hpp, outlier
// importance included); buckets, summaries and the outlier ranking stay on the host, shared code.
enum class AttentionDevice { kCpu, kCuda };

struct AttentionOptions {
  std::vector<int> topk = {1, 8, 32};
  // Outlier importance (paper Fig. 3): percent of K entries patched back to exact; empty: skip.
  std::vector<double> outlier_percents = {0.1, 1.0, 5.0};
  bool per_position = true;  // keep the per-position arrays of every head
  int q_first = -1;          // position of query row 0; -1: T - Tq
  // Position buckets [edges[i], edges[i+1]), ascending from 0; empty: 0, 1, 2, 4, 8, ... (log2).
  std::vector<int> bucket_edges;
  int block = 64;  // query rows per GEMM block (CPU)
  // CPU worker threads over blocks of query rows; 0: OpenMP's default. Results do not depend on it.
  int threads = 0;
  AttentionDevice device = AttentionDevice::kCpu;
};

// Means over a set of (head, query position) samples.
struct AttentionSummary {
  std::int64_t count = 0;
  double logit_mae = 0, logit_rmse = 0, kl = 0, kl_max = 0, js = 0, output_nmse = 0;
  std::vector<double> topk_overlap;  // per AttentionOptions::topk
};

// Per query position of one head (each [Tq]).
struct PositionMetrics {
  std::vector<double> logit_mae, logit_rmse, kl, js, output_nmse;
  std::vector<std::vector<double>> topk_overlap;  // [k][Tq]
};

struct HeadAttentionMetrics {
  int q_head = 0, kv_head = 0;
  AttentionSummary summary;
  std::vector<AttentionSummary> buckets;
  PositionMetrics positions;  // empty unless per_position
};

// Outlier importance of one percent level over the layer.
struct OutlierImportance {
  double percent = 0;
  std::int64_t patched_entries = 0;  // over all KV heads
  double kl = 0;                     // mean KL over (query head, position) after patching K̂
  double k_err_share = 0;            // share of ‖K − K̂‖² held by the patched entries
};

struct AttentionReport {
  int q_heads = 0, kv_heads = 0, tokens = 0, queries = 0, head_dim = 0, q_first = 0;
  std::vector<int> topk;
  std::vector<int> bucket_edges;
  std::vector<HeadAttentionMetrics> heads;  // [Hq]
  AttentionSummary summary;                 // over every head and position
  std::vector<AttentionSummary> buckets;    // over every head, per position bucket
  std::vector<OutlierImportance> outliers;  // per outlier percent
};

// Whether kvarn_eval was built with kvarn_cuda (AttentionDevice::kCuda available), and the
// number of CUDA devices it sees (0 without CUDA). kCuda throws kvarn::Error when either is 0.
bool attention_cuda_built();
int attention_cuda_devices();

// q: [Hq] of [Tq, D]; k, v, k_hat, v_hat: [Hkv] of [T, D]. k_quantized (optional, [Hkv] of [T]):
// the tokens the method quantized; outlier patching only picks entries of those tokens.
AttentionReport attention_metrics(
    const std::vector<Matrix>& q, const std::vector<Matrix>& k, const std::vector<Matrix>& v,
    const std::vector<Matrix>& k_hat, const std::vector<Matrix>& v_hat,
    const AttentionOptions& opts = {},
    const std::vector<std::vector<std::uint8_t>>* k_quantized = nullptr);
// From quantize_sequence results of each KV head (the method's cache as attention reads it).
AttentionReport attention_metrics(const std::vector<Matrix>& q, const std::vector<Matrix>& k,
                                  const std::vector<Matrix>& v,
                                  const std::vector<SequenceResult>& quantized,
                                  const AttentionOptions& opts = {});
// Quantizes each KV head with the method (quantize_sequence) and measures.
AttentionReport attention_metrics(const Method& method, const std::vector<Matrix>& q,
                                  const std::vector<Matrix>& k, const std::vector<Matrix>& v,
                                  const LayerContext& layer = {},
                                  const AttentionOptions& opts = {});

// Causal single-head attention output [Tq, D] in double (q_first as in AttentionOptions):
// core's attention_head_ref on the inputs converted to double.
MatrixD reference_attention(const Matrix& q, const Matrix& k, const Matrix& v, int q_first = -1);

// Primitives on one logit row (same length, finite), in nats.
double kl_from_logits(std::span<const double> s, std::span<const double> s_hat);  // KL(p‖p̂)
double js_from_logits(std::span<const double> s, std::span<const double> s_hat);
// |topk(s) ∩ topk(ŝ)| / k; ties broken by lower index; 1 when the row has <= k entries.
double topk_overlap(std::span<const double> s, std::span<const double> s_hat, int k);

void to_json(nlohmann::json& j, const AttentionSummary& s);
void to_json(nlohmann::json& j, const HeadAttentionMetrics& h);
void to_json(nlohmann::json& j, const OutlierImportance& o);
void to_json(nlohmann::json& j, const AttentionReport& r);

}  // namespace kvarn

#endif  // KVARN_EVAL_ATTENTION_HPP_
