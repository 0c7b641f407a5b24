// GPU evaluation of the per-row attention metrics (docs/metrics.md §3) with the formulas of
// kvarn/core/attention_row.hpp, which the CPU reference (eval's attention_metrics) uses too.
//
// Plain C++ interface (no CUDA headers needed); device memory is owned inside the call. Logits
// q·k / sqrt(D) and everything after them are computed in double, causal, GQA: query head h reads
// KV head h / (Hq / Hkv), query row i sits at position q_first + i and attends to keys
// 0..q_first+i. Each row is summed in one fixed order, so results are deterministic; they equal the
// CPU values to rounding (different summation order), top-k overlaps exactly unless two logits of a
// row tie within rounding.
#ifndef KVARN_CUDA_ATTENTION_METRICS_HPP_
#define KVARN_CUDA_ATTENTION_METRICS_HPP_

#include <vector>

namespace kvarn::cuda {

struct AttentionRowsProblem {
  int q_heads = 0, kv_heads = 0;  // q_heads a multiple of kv_heads
  int tokens = 0;                 // T
  int queries = 0;                // Tq
  int head_dim = 0;               // D, at most kAttentionMaxHeadDim
  int q_first = -1;               // position of query row 0; -1: tokens - queries
  std::vector<int> topk;          // top-k overlap levels, each in [1, kAttentionMaxTopk]
  bool kl_only = false;           // KL only (outlier importance): v, v_hat unused
};

inline constexpr int kAttentionMaxHeadDim = 1024;
inline constexpr int kAttentionMaxTopk = 2048;

// fp32 row-major, one pointer per head: q [Hq] of [Tq, D]; k, v, k_hat, v_hat [Hkv] of [T, D].
struct AttentionRowsInput {
  std::vector<const float*> q, k, v, k_hat, v_hat;
  bool on_device = false;  // the pointers are CUDA device pointers (else host memory)
};

// Row r = h * queries + i. Each array has Hq * Tq entries; with kl_only only `kl` is filled.
struct AttentionRows {
  std::vector<double> logit_mae, logit_rmse, kl, js, output_nmse;
  std::vector<std::vector<double>> topk_overlap;  // [topk.size()][Hq * Tq]
};

// Throws kvarn::Error on bad arguments, when there is no CUDA device or when device memory runs
// out; other CUDA errors throw kvarn::Error (KVARN_CUDA_CHECK). Synchronous.
AttentionRows attention_rows(const AttentionRowsProblem& problem, const AttentionRowsInput& input);

}  // namespace kvarn::cuda

#endif  // KVARN_CUDA_ATTENTION_METRICS_HPP_
