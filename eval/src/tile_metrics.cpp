#include "kvarn/eval/tile_metrics.hpp"

#include <algorithm>
#include <vector>

#include "kvarn/core/rotation.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn {
namespace {

// [rows, cols] row-major -> [cols, rows] row-major.
void transpose(const float* src, int rows, int cols, float* dst) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      dst[static_cast<std::size_t>(c) * rows + r] = src[static_cast<std::size_t>(r) * cols + c];
}

KvarnStreamStageMetrics stream_stages(StreamKind kind, const KvarnConfig& cfg, const Rotation& rot,
                                      const Matrix& x, int first, int tiles,
                                      const MetricOptions& opts) {
  const int d = rot.dim(), g = cfg.group;
  const bool is_key = kind == StreamKind::kKey;
  const int rows_o = is_key ? d : g, cols_o = is_key ? g : d;
  const std::size_t tile_n = static_cast<std::size_t>(g) * d, total = tile_n * tiles;
  std::vector<float> raw(total), rot_exact(total), rotated(total), normalized(total),
      rtn_dequant(total), deq_rot(total), deq(total), oriented(tile_n), tmp(tile_n);
  const KvarnRecordLayout lay = kvarn_record_layout(d, cfg);
  std::vector<std::uint8_t> record(lay.aligned);
  KvarnStreamStageMetrics out;
  KvarnStreamStages st;
  for (int i = 0; i < tiles; ++i) {
    const float* rows = x.data() + static_cast<std::size_t>(first + i * g) * d;
    const std::size_t off = tile_n * i;
    std::fill(record.begin(), record.end(), 0);
    kvarn_encode_stream(kind, cfg, rot, rows, record.data(), &st);
    std::copy(rows, rows + tile_n, raw.begin() + off);
    std::copy(rows, rows + tile_n, rot_exact.begin() + off);
    rot.forward(rot_exact.data() + off, g);
    std::copy(st.rotated.begin(), st.rotated.end(), rotated.begin() + off);
    std::copy(st.dequant_rotated.begin(), st.dequant_rotated.end(), deq_rot.begin() + off);
    std::copy(st.dequant.begin(), st.dequant.end(), deq.begin() + off);
    // RTN reconstruction in the normalized (oriented) domain, before scale absorption.
    for (int r = 0; r < rows_o; ++r)
      for (int c = 0; c < cols_o; ++c) {
        const std::size_t j = static_cast<std::size_t>(r) * cols_o + c;
        tmp[j] = static_cast<float>(st.codes[j]) * st.rtn_scale[r] + st.rtn_lo[r];
      }
    if (is_key) {
      transpose(st.normalized.data(), d, g, normalized.data() + off);
      transpose(tmp.data(), d, g, rtn_dequant.data() + off);
      transpose(rows, g, d, oriented.data());
    } else {
      std::copy(st.normalized.begin(), st.normalized.end(), normalized.begin() + off);
      std::copy(tmp.begin(), tmp.end(), rtn_dequant.begin() + off);
      std::copy(rows, rows + tile_n, oriented.begin());
    }
    out.imbalance_raw += imbalance(oriented.data(), rows_o, cols_o, cfg.varn.imbalance_floor);
    out.imbalance_rotated += st.varn.imbalance_before;
    out.imbalance_normalized += st.varn.imbalance_after;
    out.imbalance_normalized_max =
        std::max(out.imbalance_normalized_max, static_cast<double>(st.varn.imbalance_after));
    out.mean_best_iter += st.varn.best_iter;
  }
  if (tiles > 0) {
    out.imbalance_raw /= tiles;
    out.imbalance_rotated /= tiles;
    out.imbalance_normalized /= tiles;
    out.mean_best_iter /= tiles;
  }
  const int n_rows = tiles * g;
  out.rotation = reconstruction_metrics(rot_exact.data(), rotated.data(), n_rows, d, opts);
  out.quant_normalized =
      reconstruction_metrics(normalized.data(), rtn_dequant.data(), n_rows, d, opts);
  out.quant_rotated = reconstruction_metrics(rotated.data(), deq_rot.data(), n_rows, d, opts);
  out.end_to_end = reconstruction_metrics(raw.data(), deq.data(), n_rows, d, opts);
  return out;
}

StreamEndToEnd end_to_end(const Matrix& x, const Matrix& x_hat,
                          const std::vector<std::uint8_t>& quantized, const MetricOptions& opts) {
  KVARN_CHECK(x.rows() == x_hat.rows() && x.cols() == x_hat.cols(), "method_metrics: input is ",
              x.rows(), "x", x.cols(), " but reconstruction is ", x_hat.rows(), "x", x_hat.cols());
  KVARN_CHECK(static_cast<Eigen::Index>(quantized.size()) == x.rows(),
              "method_metrics: ", quantized.size(), " quantized flags for ", x.rows(), " tokens");
  StreamEndToEnd s;
  const int rows = static_cast<int>(x.rows()), cols = static_cast<int>(x.cols());
  s.quantized_tokens = static_cast<int>(
      std::count_if(quantized.begin(), quantized.end(), [](std::uint8_t q) { return q != 0; }));
  s.all_tokens = reconstruction_metrics(x.data(), x_hat.data(), rows, cols, opts);
  s.quantized_only =
      reconstruction_metrics(x.data(), x_hat.data(), rows, cols, opts, quantized.data());
  return s;
}

}  // namespace

KvarnStageReport kvarn_stage_metrics(const KvarnConfig& cfg, const Matrix& k, const Matrix& v,
                                     int first_token, int tiles, const MetricOptions& opts) {
  KVARN_CHECK(k.rows() == v.rows() && k.cols() == v.cols(), "kvarn_stage_metrics: K is ", k.rows(),
              "x", k.cols(), " but V is ", v.rows(), "x", v.cols());
  KVARN_CHECK(first_token >= 0 && tiles >= 0 &&
                  first_token + static_cast<Eigen::Index>(tiles) * cfg.group <= k.rows(),
              "kvarn_stage_metrics: tiles [", first_token, ", +", tiles, "x", cfg.group,
              ") exceed ", k.rows(), " tokens");
  const int d = static_cast<int>(k.cols());
  check_finite(k.data(), static_cast<int>(k.rows()), d, "kvarn_stage_metrics K");
  check_finite(v.data(), static_cast<int>(v.rows()), d, "kvarn_stage_metrics V");
  const Rotation rot(cfg.rotation, d, cfg.rotation_seed);
  KvarnStageReport r;
  r.first_token = first_token;
  r.tiles = tiles;
  r.group = cfg.group;
  r.head_dim = d;
  r.key = stream_stages(StreamKind::kKey, cfg, rot, k, first_token, tiles, opts);
  r.value = stream_stages(StreamKind::kValue, cfg, rot, v, first_token, tiles, opts);
  return r;
}

KvarnStageReport kvarn_stage_metrics(const KvarnMethod& method, const Matrix& k, const Matrix& v,
                                     const MetricOptions& opts) {
  const KvarnConfig& cfg = method.config();
  method.check_head_dim(static_cast<int>(k.cols()));
  const int t = static_cast<int>(k.rows());
  const int first = std::min(cfg.sink(), t);
  return kvarn_stage_metrics(cfg, k, v, first, (t - first) / cfg.group, opts);
}

MethodTileReport method_metrics(const SequenceResult& q, const Matrix& k, const Matrix& v,
                                const MetricOptions& opts) {
  MethodTileReport r;
  r.tokens = static_cast<int>(k.rows());
  r.head_dim = static_cast<int>(k.cols());
  r.key = end_to_end(k, q.k_hat, q.k_quantized, opts);
  r.value = end_to_end(v, q.v_hat, q.v_quantized, opts);
  return r;
}

MethodTileReport method_metrics(const Method& method, const Matrix& k, const Matrix& v,
                                const LayerContext& layer, const MetricOptions& opts) {
  MethodTileReport r = method_metrics(quantize_sequence(method, k, v, layer), k, v, opts);
  r.method = method.name();
  r.spec = method.spec();
  if (const auto* kv = dynamic_cast<const KvarnMethod*>(&method);
      kv != nullptr && !method.layer_skipped(layer)) {
    r.stages = kvarn_stage_metrics(*kv, k, v, opts);
  }
  return r;
}

void to_json(nlohmann::json& j, const KvarnStreamStageMetrics& m) {
  j = nlohmann::json{{"rotation", m.rotation},
                     {"quant_normalized", m.quant_normalized},
                     {"quant_rotated", m.quant_rotated},
                     {"end_to_end", m.end_to_end},
                     {"imbalance_raw", json_number(m.imbalance_raw)},
                     {"imbalance_rotated", json_number(m.imbalance_rotated)},
                     {"imbalance_normalized", json_number(m.imbalance_normalized)},
                     {"imbalance_normalized_max", json_number(m.imbalance_normalized_max)},
                     {"mean_best_iter", m.mean_best_iter}};
}

void to_json(nlohmann::json& j, const KvarnStageReport& r) {
  j = nlohmann::json{{"first_token", r.first_token}, {"tiles", r.tiles}, {"group", r.group},
                     {"head_dim", r.head_dim},       {"key", r.key},     {"value", r.value}};
}

void to_json(nlohmann::json& j, const StreamEndToEnd& s) {
  j = nlohmann::json{{"quantized_tokens", s.quantized_tokens},
                     {"all_tokens", s.all_tokens},
                     {"quantized_only", s.quantized_only}};
}

void to_json(nlohmann::json& j, const MethodTileReport& r) {
  j = nlohmann::json{{"method", r.method},     {"spec", r.spec}, {"tokens", r.tokens},
                     {"head_dim", r.head_dim}, {"key", r.key},   {"value", r.value}};
  if (r.stages) j["stages"] = *r.stages;
}

}  // namespace kvarn
