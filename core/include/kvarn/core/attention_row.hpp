// Per-row attention metrics (docs/metrics.md §3), defined once for the CPU reference
// (eval/src/attention.cpp) and the CUDA path (cuda/src/attention_metrics.cu).
//
// A row is one (query head, query position): logits s_j and ŝ_j over the n visible keys, in
// double. The primitives are per-key terms and per-row finishers; each path sums the terms in its
// own order (the CPU sequentially by key index, the GPU in a fixed tree), so the two paths agree
// to rounding and each is deterministic. Host-only builds need no CUDA (KVARN_HD = inline).
#ifndef KVARN_CORE_ATTENTION_ROW_HPP_
#define KVARN_CORE_ATTENTION_ROW_HPP_

#include <math.h>

#include <cstdint>

#include "kvarn/core/portable_math.hpp"  // KVARN_HD, bits_double

namespace kvarn::attention_row {

// ln 2 as log1p(1), so that ln2() - softplus(0) is exactly 0 (JS of identical rows is exactly 0).
KVARN_HD double ln2() { return ::log1p(1.0); }

KVARN_HD double softplus(double x) { return x > 0 ? x + ::log1p(::exp(-x)) : ::log1p(::exp(x)); }

// std::max / std::clamp on doubles, spelled out for device code (same comparisons, same result).
KVARN_HD double max_of(double a, double b) { return a < b ? b : a; }
KVARN_HD double clamp_to(double x, double lo, double hi) { return x < lo ? lo : (hi < x ? hi : x); }

// log Σ exp(s_j) from the row maximum mx and Σ exp(s_j − mx).
KVARN_HD double lse_finish(double mx, double sum_exp) { return mx + ::log(sum_exp); }

// Per-key terms with ls = s_j − lse(s), lsh = ŝ_j − lse(ŝ), p = exp(ls), ph = exp(lsh).
// KL(p‖p̂) uses log-probabilities, so no log(0) occurs.
KVARN_HD double kl_term(double p, double ls, double lsh) { return p * (ls - lsh); }
// With δ = lsh − ls: log(p / m) = ln2 − softplus(δ), log(p̂ / m) = ln2 − softplus(−δ), m the
// mixture: exactly 0 for identical rows (no exp/log round trip), no log(0) when p underflows.
// softplus(δ) and softplus(−δ) share log1p(exp(−|δ|)), computed once: the same bits as two calls.
KVARN_HD double js_term(double p, double ph, double ls, double lsh, double l2) {
  const double dlt = lsh - ls;
  const double tail = ::log1p(::exp(-::fabs(dlt)));
  const double sp_pos = dlt > 0 ? dlt + tail : tail;   // softplus(δ)
  const double sp_neg = dlt < 0 ? -dlt + tail : tail;  // softplus(−δ)
  return p * (l2 - sp_pos) + ph * (l2 - sp_neg);
}

// Per-row finishers of the summed terms. Rounding can leave KL a hair below 0 and JS above ln 2.
KVARN_HD double finish_kl(double kl_sum) { return max_of(0.0, kl_sum); }
KVARN_HD double finish_js(double js_sum, double l2) { return clamp_to(0.5 * js_sum, 0.0, l2); }
// abs_sum = Σ |ŝ_j − s_j|, sq_sum = Σ (ŝ_j − s_j)² over the n keys.
KVARN_HD double finish_mae(double abs_sum, int n) { return abs_sum / n; }
KVARN_HD double finish_rmse(double sq_sum, int n) { return ::sqrt(sq_sum / n); }
// ‖ô − o‖² / ‖o‖² with the section-1 zero convention: 0/0 = 0, e/0 = +inf.
KVARN_HD double output_nmse(double err, double ref) {
  if (ref > 0) return err / ref;
  return err > 0 ? bits_double(0x7ff0000000000000ULL) : 0.0;
}

// Top-k tie rule: key a ranks before key b when its logit is larger, or equal with a lower index.
// A total order, so topk of a row is unique and the k first keys of one ranking are topk for every
// k.
KVARN_HD bool ranks_before(double va, int a, double vb, int b) {
  return va != vb ? va > vb : a < b;
}

KVARN_HD bool prefix_contains(const int* idx, int k, int x) {
  for (int j = 0; j < k; ++j)
    if (idx[j] == x) return true;
  return false;
}

// |topk(s) ∩ topk(ŝ)| from the first k entries of each ranking (distinct indices).
KVARN_HD int overlap_count(const int* a, const int* b, int k) {
  int common = 0;
  for (int i = 0; i < k; ++i) common += prefix_contains(b, k, a[i]) ? 1 : 0;
  return common;
}

// topk_overlap of a row of n keys: 1 when the row has <= k keys (both top sets are the row).
KVARN_HD double topk_overlap_value(int common, int k, int n) {
  return n <= k ? 1.0 : static_cast<double>(common) / k;
}

}  // namespace kvarn::attention_row

#endif  // KVARN_CORE_ATTENTION_ROW_HPP_
