// Per-stage and end-to-end reconstruction metrics of a method on one (layer, KV head) sequence.
//
// KVarN (every tile the cache really quantizes, i.e. the full groups after the sink), per stream:
//   raw --rotate--> rotated (fp16) --VarN--> normalized --RTN--> codes/scales
//       --dequant--> dequantized rotated --inverse rotate--> dequantized original
//   rotation          fp32 rotation vs its fp16 rounding (rotated frame: the rounding error)
//   quant_normalized  normalized vs codes·rtn_scale + rtn_lo (normalized domain, before absorption)
//   quant_rotated     rotated (fp16) vs dequantized rotated (absorbed fp16 scales included)
//   end_to_end        raw vs dequantized original
//   imbalance (varn.hpp Imb) of the raw tile, of the rotated tile (VarN's "before") and after VarN.
// Every method: end to end through quantize_sequence (the method's own policy), over all tokens and
// over the tokens it really quantized (fp16-kept sink / tail / windows left out).
// All stage arrays are measured token-major ([tokens, D]; K's oriented arrays are transposed back).
#ifndef KVARN_EVAL_TILE_METRICS_HPP_
#define KVARN_EVAL_TILE_METRICS_HPP_

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "kvarn/core/kvarn.hpp"
#include "kvarn/core/method.hpp"
#include "kvarn/eval/metrics.hpp"

namespace kvarn {

struct KvarnStreamStageMetrics {
  ReconstructionMetrics rotation, quant_normalized, quant_rotated, end_to_end;
  // Means over tiles of Imb() of the raw oriented tile, the rotated one and the balanced one.
  double imbalance_raw = 0, imbalance_rotated = 0, imbalance_normalized = 0;
  double imbalance_normalized_max = 0;
  double mean_best_iter = 0;  // VarN iteration kept (0: identity), mean over tiles
};

struct KvarnStageReport {
  int first_token = 0;  // first token of the first measured tile
  int tiles = 0;        // measured tiles of `group` tokens each
  int group = 0, head_dim = 0;
  KvarnStreamStageMetrics key, value;
};

// Stages of `tiles` consecutive tiles starting at `first_token` (k, v: [T, D], finite).
KvarnStageReport kvarn_stage_metrics(const KvarnConfig& cfg, const Matrix& k, const Matrix& v,
                                     int first_token, int tiles, const MetricOptions& opts = {});
// The tiles the KVarN cache quantizes: full groups after the sink.
KvarnStageReport kvarn_stage_metrics(const KvarnMethod& method, const Matrix& k, const Matrix& v,
                                     const MetricOptions& opts = {});

struct StreamEndToEnd {
  int quantized_tokens = 0;
  ReconstructionMetrics all_tokens;      // every token of the cache (fp16-kept ones included)
  ReconstructionMetrics quantized_only;  // tokens the method quantized (rows = 0 when none)
};

struct MethodTileReport {
  std::string method;  // name()
  std::string spec;
  int tokens = 0, head_dim = 0;
  StreamEndToEnd key, value;
  std::optional<KvarnStageReport> stages;  // KVarN only
};

// End-to-end metrics from an existing quantize_sequence result.
MethodTileReport method_metrics(const SequenceResult& q, const Matrix& k, const Matrix& v,
                                const MetricOptions& opts = {});
// Runs quantize_sequence; adds the stage report when the method is KVarN.
MethodTileReport method_metrics(const Method& method, const Matrix& k, const Matrix& v,
                                const LayerContext& layer = {}, const MetricOptions& opts = {});

void to_json(nlohmann::json& j, const KvarnStreamStageMetrics& m);
void to_json(nlohmann::json& j, const KvarnStageReport& r);
void to_json(nlohmann::json& j, const StreamEndToEnd& s);
void to_json(nlohmann::json& j, const MethodTileReport& r);

}  // namespace kvarn

#endif  // KVARN_EVAL_TILE_METRICS_HPP_
