// Summary-row statistics of the sweep engine (docs/metrics.md, "Position buckets" and
// "Confidence intervals"):
//
//  * UnitStats: per metric, the (numerator, denominator) each unit contributes to a pooled summary
//    value (a metric's sum and row count, NMSE's error and reference energy). A unit is one
//    (sequence, layer, KV head) slab of a tiles file; its percentile bootstrap CI resamples units
//    (eval's bootstrap_ratio_ci), so the interval brackets the pooled value the row reports.
//  * AttentionBuckets: attention metrics of every (query head, query row) by the row's position
//    bucket (distance to the newest quantized token it reads), the headline over rows that read
//    at least one quantized token.
#ifndef KVARN_SWEEPS_UNIT_STATS_HPP_
#define KVARN_SWEEPS_UNIT_STATS_HPP_

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvarn/eval/attention.hpp"
#include "kvarn/eval/bootstrap.hpp"
#include "kvarn/eval/position_buckets.hpp"

namespace kvarn {

// The bootstrap of every summary-row CI: seeded by the config's seed, 2000 resamples, 95 %.
BootstrapOptions row_bootstrap_options(std::int64_t seed);
// The units the rows' CIs resample.
inline constexpr const char* kRowBootstrapUnits =
    "tiles: (sequence, layer, KV head) slabs; accumulation/decode: prompts";
// What the case record and provenance say about it.
nlohmann::json row_bootstrap_json(std::int64_t seed, const char* unit);

class UnitStats {
 public:
  // Adds (num, den) to `unit` of `metric` (units keep their first-seen order).
  void add(const std::string& metric, const std::string& unit, double num, double den);
  // CI of sum(num) / sum(den) over the units with den > 0; none with fewer than 2 such units or a
  // non-finite sum.
  std::optional<BootstrapCi> ci(const std::string& metric, const BootstrapOptions& o) const;
  // {metric: {unit: num / den}} (units with den > 0): the per-unit values paired comparisons use.
  nlohmann::json unit_values() const;

 private:
  struct Units {
    std::vector<std::string> ids;
    std::vector<double> num, den;
  };
  std::map<std::string, Units> metrics_;
};

// The row's CI columns (ci_lo, ci_hi, ci_units) added to `row` when `ci` is set.
void add_ci_columns(const std::optional<BootstrapCi>& ci, nlohmann::json& row);

class AttentionBuckets {
 public:
  // One KV head's report; `distances[p]`: distance of the row at position p (row_distances over
  // the measured cache). Adds the unit's all-rows sums under "attention.<metric>" and the
  // headline's under "attention.headline.<metric>" to `units`.
  void add(const AttentionReport& rep, const std::vector<int>& distances, const std::string& unit,
           UnitStats* units);
  // "headline.<metric>", "headline.rows", "bucket.<label>.<metric>", "bucket.<label>.rows"
  // (metric names as the attention rows: kl.mean, js.mean, logit_mae, ...); buckets without rows
  // and an empty headline are left out.
  std::vector<std::pair<std::string, double>> metrics() const;

 private:
  BucketScheme scheme_;
  std::vector<std::string> names_;        // metric names, fixed order
  std::vector<std::vector<double>> sum_;  // [metric][bucket]
  std::vector<long long> rows_;           // [bucket]
};

// Model-loop position buckets (docs/metrics.md, "Position buckets"). Blocks end at
// context_len[j] (block j starts at context_len[j - 1], block 0 at 0); a block's cell of layer l
// is labelled by the distance of its first row, i.e. its nearest quantized token:
//  accumulated protocol: the cache as it stood after `start` tokens (policy exact; the block's own
//    K/V are read exact) or after `end` tokens (quantized: the block is written first);
//  static protocol (`static_cache`): the final cache of context_len.back() tokens, rows before
//    `start` (exact) or up to `start` (quantized).
// Returns [block][layer]; kReadsNoQuantizedToken where the cell reads only fp16 tokens.
std::vector<std::vector<int>> block_distances(const Method& method, int head_dim, int num_layers,
                                              const std::vector<int>& context_len,
                                              bool quantized_policy, bool static_cache);

// Teacher-forced step t (t = 0..steps-1) is the row at position context - 1 + t: step 0 the last
// block's last row (the cache after that block's start `last_block_start`, or after context
// tokens under `quantized`), step t >= 1 a decode token reading context + t - 1 stored tokens
// (exact) or context + t (quantized). Its distance is the nearest over every layer (the logits
// read all layers); kReadsNoQuantizedToken when no layer holds a quantized token it reads.
std::vector<int> decode_step_distances(const Method& method, int head_dim, int num_layers,
                                       int context, int last_block_start, int steps,
                                       bool quantized_policy);

}  // namespace kvarn

#endif  // KVARN_SWEEPS_UNIT_STATS_HPP_
