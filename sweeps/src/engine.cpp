// Sweep engine: compute cases (eval's metrics over every selected slab), pool them into tidy
// summary rows, write each case atomically, resume, shard, and run the report at the end.
#include "kvarn/sweeps/engine.hpp"

#include <H5Cpp.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>

#include "capture_step.hpp"
#include "kvarn/core/kvarn.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/atomic_file.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/h5_io.hpp"
#include "kvarn/data/tile_file.hpp"
#include "kvarn/eval/attention.hpp"
#include "kvarn/eval/metrics.hpp"
#include "kvarn/eval/position_buckets.hpp"
#include "kvarn/eval/tile_metrics.hpp"
#include "kvarn/sweeps/progress.hpp"
#include "kvarn/sweeps/provenance.hpp"
#include "kvarn/sweeps/report.hpp"
#include "kvarn/sweeps/store.hpp"
#include "kvarn/sweeps/unit_stats.hpp"
#include "runner_steps.hpp"

#ifndef KVARN_SOURCE_ROOT
#define KVARN_SOURCE_ROOT ""
#endif

namespace kvarn {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kAll = -1;  // layer/head value of pooled rows ("all")

std::string two_digits(const char* prefix, int i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%s%02d", prefix, i);
  return buf;
}

std::string percent_label(double p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%gpct", p);
  return buf;
}

// Drops the long per-token / per-position vectors from eval's JSON: they go to arrays/*.h5.
void strip_vectors(json& j) {
  if (j.is_object()) {
    for (const char* k : {"nmse_per_channel", "nmse_per_token", "positions"}) j.erase(k);
    for (auto& [k, v] : j.items()) strip_vectors(v);
  } else if (j.is_array()) {
    for (json& v : j) strip_vectors(v);
  }
}

// Pools end-to-end reconstruction (and KVarN stages) of one stream over slabs: sums of squares
// pooled (NMSE = Σerr/Σref via eval's safe_nmse), cosines row-weighted, maxima max-ed.
struct ReconPool {
  double err = 0, ref = 0, q_err = 0, q_ref = 0, cos_sum = 0, cos_min = 1, max_abs = 0;
  double mag = 0, dir = 0, norm_ratio = 0;
  std::array<double, kTopRowFractions.size()> top_mag{};  // row-weighted over slabs
  std::int64_t rows = 0, elems = 0, q_rows = 0;
  int stage_tiles = 0;
  std::array<double, 4> st_err{}, st_ref{};
  double imb_raw = 0, imb_rot = 0, imb_norm = 0, best_iter = 0;

  void add(const StreamEndToEnd& s) {
    const ReconstructionMetrics& a = s.all_tokens;
    err += a.sum_sq_err;
    ref += a.sum_sq_ref;
    rows += a.rows;
    elems += a.rows * a.cols;
    cos_sum += a.mean_cos * static_cast<double>(a.rows);
    cos_min = std::min(cos_min, a.min_cos);
    max_abs = std::max(max_abs, a.max_abs);
    mag += a.magnitude_err;
    dir += a.direction_err;
    norm_ratio += a.norm_ratio_mean * static_cast<double>(a.rows);
    for (std::size_t i = 0; i < top_mag.size(); ++i)
      top_mag[i] += a.top_magnitude_share[i] * static_cast<double>(a.rows);
    q_err += s.quantized_only.sum_sq_err;
    q_ref += s.quantized_only.sum_sq_ref;
    q_rows += s.quantized_only.rows;
  }
  void add(const KvarnStreamStageMetrics& m, int tiles) {
    const ReconstructionMetrics* st[4] = {&m.rotation, &m.quant_normalized, &m.quant_rotated,
                                          &m.end_to_end};
    for (int i = 0; i < 4; ++i) {
      st_err[i] += st[i]->sum_sq_err;
      st_ref[i] += st[i]->sum_sq_ref;
    }
    imb_raw += m.imbalance_raw * tiles;
    imb_rot += m.imbalance_rotated * tiles;
    imb_norm += m.imbalance_normalized * tiles;
    best_iter += m.mean_best_iter * tiles;
    stage_tiles += tiles;
  }
  std::vector<std::pair<std::string, double>> metrics() const {
    const double nmse = safe_nmse(err, ref);
    std::vector<std::pair<std::string, double>> m = {
        {"end_to_end.nmse", nmse},
        {"end_to_end.snr_db", snr_db_from_nmse(nmse)},
        {"end_to_end.mse", elems > 0 ? err / static_cast<double>(elems) : 0.0},
        {"end_to_end.cos_mean", rows > 0 ? cos_sum / static_cast<double>(rows) : 1.0},
        {"end_to_end.cos_min", cos_min},
        {"end_to_end.max_abs", max_abs},
        {"end_to_end.magnitude_share", mag + dir > 0 ? mag / (mag + dir) : 0.0},
        {"end_to_end.norm_ratio_mean", rows > 0 ? norm_ratio / static_cast<double>(rows) : 1.0}};
    // Share of magnitude (token-scale) error within the rows holding the largest errors (paper
    // Fig. 1a); per slab, then row-weighted over slabs.
    for (std::size_t i = 0; i < top_mag.size(); ++i) {
      m.emplace_back("end_to_end.magnitude_share_top." + percent_label(kTopRowFractions[i] * 100.0),
                     rows > 0 ? top_mag[i] / static_cast<double>(rows) : 0.0);
    }
    if (q_rows > 0) m.emplace_back("quantized_only.nmse", safe_nmse(q_err, q_ref));
    if (stage_tiles > 0) {
      const char* names[4] = {"stage.rotation.nmse", "stage.quant_normalized.nmse",
                              "stage.quant_rotated.nmse", "stage.end_to_end.nmse"};
      for (int i = 0; i < 4; ++i) m.emplace_back(names[i], safe_nmse(st_err[i], st_ref[i]));
      m.emplace_back("stage.imbalance_raw", imb_raw / stage_tiles);
      m.emplace_back("stage.imbalance_rotated", imb_rot / stage_tiles);
      m.emplace_back("stage.imbalance_normalized", imb_norm / stage_tiles);
      m.emplace_back("stage.best_iter_mean", best_iter / stage_tiles);
    }
    return m;
  }
};

// Pools attention summaries over (head, position) samples: count-weighted means, max of kl_max.
struct AttentionPool {
  std::int64_t count = 0;
  double logit_mae = 0, logit_rmse = 0, kl = 0, kl_max = 0, js = 0, output_nmse = 0;
  std::vector<double> topk;
  std::map<double, std::pair<double, double>> outliers;  // percent -> (kl, k_err_share) sums
  std::int64_t outlier_weight = 0;

  void add(const AttentionSummary& s) {
    const double w = static_cast<double>(s.count);
    count += s.count;
    logit_mae += s.logit_mae * w;
    logit_rmse += s.logit_rmse * w;
    kl += s.kl * w;
    js += s.js * w;
    output_nmse += s.output_nmse * w;
    kl_max = std::max(kl_max, s.kl_max);
    topk.resize(s.topk_overlap.size(), 0.0);
    for (std::size_t i = 0; i < s.topk_overlap.size(); ++i) topk[i] += s.topk_overlap[i] * w;
  }
  void add_outliers(const AttentionReport& r) {
    const double w = static_cast<double>(r.summary.count);
    for (const OutlierImportance& o : r.outliers) {
      outliers[o.percent].first += o.kl * w;
      outliers[o.percent].second += o.k_err_share * w;
    }
    outlier_weight += r.summary.count;
  }
  std::vector<std::pair<std::string, double>> metrics(const std::vector<int>& ks) const {
    const double w = count > 0 ? static_cast<double>(count) : 1.0;
    std::vector<std::pair<std::string, double>> m = {{"kl.mean", kl / w},
                                                     {"kl.max", kl_max},
                                                     {"js.mean", js / w},
                                                     {"logit_mae", logit_mae / w},
                                                     {"logit_rmse", logit_rmse / w},
                                                     {"output_nmse", output_nmse / w}};
    for (std::size_t i = 0; i < topk.size() && i < ks.size(); ++i) {
      m.emplace_back("topk_overlap." + std::to_string(ks[i]), topk[i] / w);
    }
    const double ow = outlier_weight > 0 ? static_cast<double>(outlier_weight) : 1.0;
    for (const auto& [p, v] : outliers) {
      m.emplace_back("outlier_kl." + percent_label(p), v.first / ow);
      m.emplace_back("outlier_k_err_share." + percent_label(p), v.second / ow);
    }
    return m;
  }
};

using PoolKey = std::tuple<int, int>;  // (model layer or kAll, head or kAll)

void write_doubles(H5::Group& g, const std::string& name, const std::vector<double>& v) {
  h5::write_dataset(g, name, H5::PredType::IEEE_F64LE, H5::PredType::NATIVE_DOUBLE,
                    {static_cast<hsize_t>(v.size())}, v.data());
}

void write_matrix(H5::Group& g, const std::string& name, const std::vector<double>& v,
                  std::size_t rows, std::size_t cols) {
  h5::write_dataset(g, name, H5::PredType::IEEE_F64LE, H5::PredType::NATIVE_DOUBLE,
                    {static_cast<hsize_t>(rows), static_cast<hsize_t>(cols)}, v.data());
}

H5::Group child_group(H5::Group& parent, const std::string& name) {
  if (parent.nameExists(name)) return parent.openGroup(name);
  return h5::create_group(parent, name);
}

std::vector<int> selected(const std::optional<std::vector<int>>& sel, int n) {
  if (sel) return *sel;
  std::vector<int> all(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) all[static_cast<std::size_t>(i)] = i;
  return all;
}

// One data file's part of a case.
struct DataPart {
  std::map<PoolKey, ReconPool> key, value;
  std::map<PoolKey, AttentionPool> attention;
  std::size_t stored_bytes = 0, fp16_bytes = 0;
  // Per-(sequence, layer, KV head) sums for the CIs of the pooled rows; attention by bucket.
  UnitStats units;
  AttentionBuckets buckets;
  // For the arrays file: per (layer, q head) KL pooled over sequences, per (layer, head) NMSE.
  std::vector<int> layers, heads, q_heads;
};

}  // namespace

std::pair<int, int> parse_shard(const std::string& text) {
  const auto slash = text.find('/');
  int i = -1, n = -1;
  try {
    KVARN_CHECK(slash != std::string::npos, "");
    std::size_t used = 0;
    i = std::stoi(text.substr(0, slash), &used);
    KVARN_CHECK(used == slash, "");
    n = std::stoi(text.substr(slash + 1), &used);
    KVARN_CHECK(used == text.size() - slash - 1, "");
  } catch (const std::exception&) {
    fail("--shard ", text, ": expected i/n, e.g. 0/4");
  }
  KVARN_CHECK(n >= 1 && i >= 0 && i < n, "--shard ", text, ": need 0 <= i < n");
  return {i, n};
}

fs::path run_directory(const SweepConfig& cfg, int shard_index, int shard_count, bool fresh) {
  std::string base = cfg.name + "-" + cfg.hash.substr(0, 12);
  if (shard_count > 1) {
    base += "-shard-" + std::to_string(shard_index) + "-of-" + std::to_string(shard_count);
  }
  const fs::path root(cfg.output);
  fs::path dir = root / base;
  if (!fresh) return dir;
  for (int k = 2; fs::exists(dir); ++k) dir = root / (base + "-" + std::to_string(k));
  return dir;
}

std::string reproduce_command(const SweepConfig& cfg, const std::string& case_id) {
  std::string cmd = "kvarn-eval sweep " + shell_quote(cfg.config_path.string());
  for (const std::string& s : cfg.sets) cmd += " --set " + shell_quote(s);
  return cmd + " --only " + case_id;
}

namespace {

// What one case accumulates while it measures every data file.
struct CaseRun {
  const SweepConfig& cfg;
  const CaseSpec& cs;
  std::unique_ptr<Method> method;
  const KvarnMethod* kvarn_method = nullptr;
  MetricOptions mopts;
  AttentionOptions aopts;
  json slabs = json::array(), attention = json::array(), accounting = json::object();
  std::vector<DataPart> parts;

  CaseRun(const SweepConfig& c, const CaseSpec& spec)
      : cfg(c), cs(spec), method(make_method(spec.spec)), parts(c.data.tiles.size()) {
    kvarn_method = dynamic_cast<const KvarnMethod*>(method.get());
    const MetricsSelection& ms = cfg.metrics;
    mopts.breakdown = ms.arrays;
    aopts.topk = ms.topk;
    aopts.outlier_percents = ms.outlier_percents;
    aopts.threads = ms.threads;
    aopts.per_position = true;  // position buckets need every row; arrays only when asked
    aopts.device = ms.device == "cuda" ? AttentionDevice::kCuda : AttentionDevice::kCpu;
  }
};

// One (sequence, layer) slab group of a data file.
struct LayerSlab {
  const TilesSource& tiles;
  const TileReader& reader;
  const SequenceInfo& si;
  int s = 0, li = 0, model_layer = 0, tokens = 0, group = 1;
  std::optional<H5::Group> glayer;  // its arrays group (none without arrays)
};

// The bootstrap unit of tile metrics: one (sequence, layer, KV head) slab.
std::string slab_unit(const LayerSlab& slab, int kv_head) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "s%d/l%d/h%d", slab.s, slab.model_layer, kv_head);
  return buf;
}

struct QuantizedHead {
  Matrix k, v;
  SequenceResult q;
};

// Per (layer, q head) attention pooled over sequences, for the KL heatmap.
using KlCells = std::map<std::pair<int, int>, AttentionPool>;

// One KV head's reconstruction metrics: pooled, written to the arrays file, and a slab record.
void measure_reconstruction(CaseRun& run, DataPart& part, LayerSlab& slab, const LayerContext& ctx,
                            int h, const QuantizedHead& qh) {
  const Method& method = *run.method;
  // Same as eval's method_metrics(Method&, ...), reusing this quantization.
  MethodTileReport rep = method_metrics(qh.q, qh.k, qh.v, run.mopts);
  rep.method = method.name();
  rep.spec = method.spec();
  if (run.kvarn_method && !method.layer_skipped(ctx)) {
    rep.stages = kvarn_stage_metrics(*run.kvarn_method, qh.k, qh.v, run.mopts);
  }
  for (const PoolKey& pk : {PoolKey{kAll, kAll}, PoolKey{slab.model_layer, h}}) {
    part.key[pk].add(rep.key);
    part.value[pk].add(rep.value);
    if (rep.stages && rep.stages->tiles > 0) {
      part.key[pk].add(rep.stages->key, rep.stages->tiles);
      part.value[pk].add(rep.stages->value, rep.stages->tiles);
    }
  }
  const std::string unit = slab_unit(slab, h);
  for (const auto& [name, m] : {std::pair{"key", &rep.key}, {"value", &rep.value}}) {
    const std::string scope = name;
    part.units.add(scope + ".end_to_end.nmse", unit, m->all_tokens.sum_sq_err,
                   m->all_tokens.sum_sq_ref);
    if (m->quantized_only.rows > 0) {
      part.units.add(scope + ".quantized_only.nmse", unit, m->quantized_only.sum_sq_err,
                     m->quantized_only.sum_sq_ref);
    }
    // The magnitude shares pool as ReconPool does: error-weighted overall, row-weighted for the
    // top rows, so each CI brackets its row's value.
    const ReconstructionMetrics& a = m->all_tokens;
    part.units.add(scope + ".end_to_end.magnitude_share", unit, a.magnitude_err,
                   a.magnitude_err + a.direction_err);
    for (std::size_t i = 0; i < kTopRowFractions.size(); ++i) {
      part.units.add(
          scope + ".end_to_end.magnitude_share_top." + percent_label(kTopRowFractions[i] * 100.0),
          unit, a.top_magnitude_share[i] * static_cast<double>(a.rows),
          static_cast<double>(a.rows));
    }
  }
  if (slab.glayer) {
    H5::Group gh = h5::create_group(*slab.glayer, two_digits("head_", h));
    write_doubles(gh, "k_nmse_per_channel", rep.key.all_tokens.nmse_per_channel);
    write_doubles(gh, "k_nmse_per_token", rep.key.all_tokens.nmse_per_token);
    write_doubles(gh, "v_nmse_per_channel", rep.value.all_tokens.nmse_per_channel);
    write_doubles(gh, "v_nmse_per_token", rep.value.all_tokens.nmse_per_token);
  }
  json j = rep;
  strip_vectors(j);
  run.slabs.push_back({{"data", slab.tiles.name},
                       {"sequence", slab.s},
                       {"layer", slab.model_layer},
                       {"head", h},
                       {"tokens", slab.tokens},
                       {"stored_bytes", qh.q.stored_bytes},
                       {"metrics", std::move(j)}});
}

// Per-position attention arrays of one query head.
void write_attention_arrays(H5::Group& glayer, const AttentionReport& rep, std::size_t i, int qh,
                            int kv_head) {
  const PositionMetrics& p = rep.heads[i].positions;
  H5::Group gq = h5::create_group(glayer, two_digits("q_head_", qh));
  h5::write_int_attr(gq, "kv_head", kv_head);
  h5::write_int_attr(gq, "q_first", rep.q_first);
  h5::write_ints_attr(gq, "topk", rep.topk);
  write_doubles(gq, "kl", p.kl);
  write_doubles(gq, "js", p.js);
  write_doubles(gq, "output_nmse", p.output_nmse);
  write_doubles(gq, "logit_mae", p.logit_mae);
  write_doubles(gq, "logit_rmse", p.logit_rmse);
  std::vector<double> tk;
  for (const auto& row : p.topk_overlap) tk.insert(tk.end(), row.begin(), row.end());
  write_matrix(gq, "topk_overlap", tk, p.topk_overlap.size(),
               p.topk_overlap.empty() ? 0 : p.topk_overlap.front().size());
}

// Attention metrics of one KV head. GQA: query head qh reads KV head qh / group; one call per KV
// head keeps that exact whatever subset of query heads was captured.
void measure_attention(CaseRun& run, DataPart& part, LayerSlab& slab, const LayerContext& ctx,
                       int h, const QuantizedHead& qhead, KlCells& kl_cells,
                       std::set<int>& q_heads_seen) {
  std::vector<Matrix> qs;
  std::vector<int> qh_model;
  for (std::size_t qi = 0; qi < slab.si.q_heads.size(); ++qi) {
    if (slab.si.q_heads[qi] / slab.group != h) continue;
    qs.push_back(slab.reader.read(slab.s, "q", slab.li, static_cast<int>(qi)).topRows(slab.tokens));
    qh_model.push_back(slab.si.q_heads[qi]);
  }
  if (qs.empty()) return;
  const AttentionReport rep = attention_metrics(qs, {qhead.k}, {qhead.v}, {qhead.q}, run.aopts);
  part.attention[{kAll, kAll}].add(rep.summary);
  part.attention[{kAll, kAll}].add_outliers(rep);
  // Every query row reads the final cache of slab.tokens tokens (static evaluation).
  part.buckets.add(rep, row_distances(*run.method, slab.reader.info().head_dim, slab.tokens, ctx),
                   slab_unit(slab, h), &part.units);
  for (std::size_t i = 0; i < rep.heads.size(); ++i) {
    const int qh = qh_model[i];
    part.attention[{slab.model_layer, qh}].add(rep.heads[i].summary);
    kl_cells[{slab.model_layer, qh}].add(rep.heads[i].summary);
    q_heads_seen.insert(qh);
    if (slab.glayer && run.cfg.metrics.arrays) write_attention_arrays(*slab.glayer, rep, i, qh, h);
  }
  json j = rep;
  strip_vectors(j);
  run.attention.push_back({{"data", slab.tiles.name},
                           {"sequence", slab.s},
                           {"layer", slab.model_layer},
                           {"kv_head", h},
                           {"q_heads", qh_model},
                           {"report", std::move(j)}});
}

// Every selected KV head of one (sequence, layer): quantize, reconstruction, then attention.
void measure_layer(CaseRun& run, DataPart& part, LayerSlab& slab, const std::vector<int>& heads,
                   int num_layers, KlCells& kl_cells, std::set<int>& q_heads_seen) {
  const LayerContext ctx{slab.model_layer, num_layers};
  const int head_dim = slab.reader.info().head_dim;
  std::map<int, QuantizedHead> quantized;
  for (int h : heads) {
    QuantizedHead qh;
    qh.k = slab.reader.read(slab.s, "k", slab.li, h).topRows(slab.tokens);
    qh.v = slab.reader.read(slab.s, "v", slab.li, h).topRows(slab.tokens);
    try {
      qh.q = quantize_sequence(*run.method, qh.k, qh.v, ctx);
    } catch (const Error& e) {  // e.g. values the method cannot hold: name the slab
      fail(slab.tiles.resolved.string(), ": /sequences/", slab.si.name, "/k,v [layer ", slab.li,
           ", head ", h, "]: ", run.cs.name, ": ", e.what());
    }
    part.stored_bytes += qh.q.stored_bytes;
    part.fp16_bytes += 4ull * static_cast<std::size_t>(slab.tokens) * head_dim;
    if (run.cfg.metrics.reconstruction) measure_reconstruction(run, part, slab, ctx, h, qh);
    quantized.emplace(h, std::move(qh));
  }
  if (!run.cfg.metrics.attention || !slab.si.has_q) return;
  for (int h : heads)
    measure_attention(run, part, slab, ctx, h, quantized.at(h), kl_cells, q_heads_seen);
}

// Layer x head matrices the report draws as heatmaps (NaN: not measured).
void write_layer_head_matrices(H5::Group& gdata, const DataPart& part, const KlCells& kl_cells,
                               bool reconstruction) {
  const std::size_t L = part.layers.size();
  if (reconstruction) {
    for (const char* stream : {"key", "value"}) {
      const auto& pools = std::string(stream) == "key" ? part.key : part.value;
      std::vector<double> m(L * part.heads.size(), NAN);
      for (std::size_t a = 0; a < L; ++a) {
        for (std::size_t b = 0; b < part.heads.size(); ++b) {
          auto it = pools.find({part.layers[a], part.heads[b]});
          if (it != pools.end()) m[a * part.heads.size() + b] = it->second.metrics()[0].second;
        }
      }
      H5::Group gs = h5::create_group(gdata, stream);
      h5::write_ints_attr(gs, "layers", part.layers);
      h5::write_ints_attr(gs, "heads", part.heads);
      write_matrix(gs, "nmse_layer_head", m, L, part.heads.size());
    }
  }
  if (part.q_heads.empty()) return;
  std::vector<double> m(L * part.q_heads.size(), NAN);
  for (std::size_t a = 0; a < L; ++a) {
    for (std::size_t b = 0; b < part.q_heads.size(); ++b) {
      auto it = kl_cells.find({part.layers[a], part.q_heads[b]});
      if (it != kl_cells.end() && it->second.count > 0) {
        m[a * part.q_heads.size() + b] = it->second.kl / static_cast<double>(it->second.count);
      }
    }
  }
  H5::Group ga = h5::create_group(gdata, "attention");
  h5::write_ints_attr(ga, "layers", part.layers);
  h5::write_ints_attr(ga, "q_heads", part.q_heads);
  write_matrix(ga, "kl_layer_head", m, L, part.q_heads.size());
}

// One data file of the case: accounting, every selected (sequence, layer, head), its arrays.
void measure_data_file(CaseRun& run, std::size_t ti, H5::H5File* h5) {
  const SweepConfig& cfg = run.cfg;
  const TilesSource& t = cfg.data.tiles[ti];
  DataPart& part = run.parts[ti];
  const TileReader reader(t.resolved);
  const TileFileInfo& info = reader.info();
  const Accounting acc = run.method->accounting(info.head_dim);
  run.accounting[t.name] = {{"head_dim", info.head_dim},
                            {"bits_per_element", acc.bits_per_element()},
                            {"bytes_per_token", acc.bytes_per_token()},
                            {"capacity_vs_fp16", acc.capacity_vs_fp16()}};
  const std::vector<int> seqs = selected(cfg.data.sequences, reader.num_sequences());
  const std::vector<int> layers = selected(cfg.data.layers, info.num_captured_layers());
  const std::vector<int> heads = selected(cfg.data.kv_heads, info.num_kv_heads);
  const int group = std::max(1, info.num_q_heads / std::max(1, info.num_kv_heads));
  for (int li : layers) part.layers.push_back(info.layers[static_cast<std::size_t>(li)]);
  part.heads = heads;
  std::optional<H5::Group> gdata;
  // The first tiles file's arrays sit at the root; further files in a group named after them.
  if (h5) gdata = ti == 0 ? h5->openGroup("/") : h5::create_group(*h5, t.name);
  KlCells kl_cells;
  std::set<int> q_heads_seen;
  for (int s : seqs) {
    const SequenceInfo& si = reader.sequence(s);
    const int T =
        cfg.data.max_tokens > 0 ? std::min(si.num_tokens, cfg.data.max_tokens) : si.num_tokens;
    for (int li : layers) {
      LayerSlab slab{t, reader, si,          s, li, info.layers[static_cast<std::size_t>(li)],
                     T, group,  std::nullopt};
      if (gdata) {
        H5::Group gslabs = child_group(*gdata, "slabs");
        H5::Group gs = child_group(gslabs, "seq_" + si.name);
        slab.glayer = child_group(gs, two_digits("layer_", slab.model_layer));
      }
      measure_layer(run, part, slab, heads, info.num_layers, kl_cells, q_heads_seen);
    }
  }
  part.q_heads.assign(q_heads_seen.begin(), q_heads_seen.end());
  if (gdata) {
    h5::write_string_attr(*gdata, "data", t.name);
    write_layer_head_matrices(*gdata, part, kl_cells, cfg.metrics.reconstruction);
  }
}

// Tidy rows: per data file, stream, (all, all) first then every (layer, head), fixed metric
// order; the accumulation rows last.
json tidy_rows(const CaseRun& run, const AccumulationCase& acc) {
  const CaseSpec& cs = run.cs;
  json rows = json::array();
  auto layer_cell = [](int x) { return x == kAll ? json("all") : json(x); };
  for (std::size_t ti = 0; ti < run.parts.size(); ++ti) {
    const DataPart& part = run.parts[ti];
    const std::string& dname = run.cfg.data.tiles[ti].name;
    const double bits = run.accounting[dname]["bits_per_element"].get<double>();
    // Bits per element as stored at the measured lengths (fp16 sink/tail/windows, boundary layers).
    const std::optional<double> eff_bits =
        part.fp16_bytes > 0 ? std::optional<double>(16.0 * static_cast<double>(part.stored_bytes) /
                                                    static_cast<double>(part.fp16_bytes))
                            : std::nullopt;
    const json eff = eff_bits ? json(*eff_bits) : json(nullptr);
    const BootstrapOptions bopts = row_bootstrap_options(run.cfg.seed);
    auto emit = [&](const std::string& scope, const PoolKey& pk,
                    const std::vector<std::pair<std::string, double>>& ms_) {
      for (const auto& [name, value] : ms_) {
        const std::string metric = scope + "." + name;  // e.g. key.end_to_end.nmse
        json row = {{"case_id", cs.id},
                    {"method", cs.name},
                    {"spec", cs.spec},
                    {"family", cs.family},
                    {"data", dname},
                    {"bits_per_element", bits},
                    {"effective_bits", eff},
                    {"metric", metric},
                    {"scope", scope},
                    {"layer", layer_cell(std::get<0>(pk))},
                    {"head", layer_cell(std::get<1>(pk))},
                    {"value", json_number(value)}};
        // Pooled rows carry the bootstrap CI over (sequence, layer, KV head) units.
        if (pk == PoolKey{kAll, kAll}) add_ci_columns(part.units.ci(metric, bopts), row);
        rows.push_back(std::move(row));
      }
    };
    // The storage a slab really took (fp16 sink / tail / windows included), in bits per element.
    if (eff_bits) emit("storage", {kAll, kAll}, {{"effective_bits", *eff_bits}});
    for (const auto& [pk, pool] : part.key) emit("key", pk, pool.metrics());  // kAll sorts first
    for (const auto& [pk, pool] : part.value) emit("value", pk, pool.metrics());
    for (const auto& [pk, pool] : part.attention) {
      emit("attention", pk, pool.metrics(run.cfg.metrics.topk));
      if (pk == PoolKey{kAll, kAll}) emit("attention", pk, part.buckets.metrics());
    }
  }
  for (const json& r : acc.rows) rows.push_back(r);
  return rows;
}

// The arrays file's header attributes.
void write_arrays_header(H5::H5File& h5, const CaseSpec& cs) {
  h5::write_string_attr(h5, "format", kArraysFormat);
  h5::write_int_attr(h5, "format_version", kArraysFormatVersion);
  h5::write_string_attr(h5, "case_id", cs.id);
  h5::write_string_attr(h5, "spec", cs.spec);
  h5::write_string_attr(h5, "method", cs.name);
}

}  // namespace

json compute_case(const SweepConfig& cfg, const CaseSpec& cs, const fs::path& arrays_path) {
  CaseRun run(cfg, cs);
  // Everything is computed inside the arrays file's atomic write, so a failure or a kill leaves
  // at most a temporary behind (removed on the next run).
  auto body = [&](H5::H5File* h5) {
    if (h5) write_arrays_header(*h5, cs);
    for (std::size_t ti = 0; ti < cfg.data.tiles.size(); ++ti) measure_data_file(run, ti, h5);
  };
  // Wall seconds per phase of the case, in the record's timing (docs/PERFORMANCE.md).
  json phases = json::object();
  auto t0 = std::chrono::steady_clock::now();
  auto lap = [&](const char* phase) {
    const auto t1 = std::chrono::steady_clock::now();
    phases[phase] = std::chrono::duration<double>(t1 - t0).count();
    t0 = t1;
  };
  // Error accumulation runs the model with the method in the loop (accumulation_case.cpp).
  AccumulationCase acc;
  if (cfg.accumulation.enabled) {
    acc = runner_steps().accumulation_case(cfg, cs);
    lap("accumulation");
  }
  // Passkey and induction copy with the method in the loop (retrieval_case.cpp).
  RetrievalCase ret;
  if (cfg.retrieval.enabled) {
    ret = runner_steps().retrieval_case(cfg, cs);
    lap("retrieval");
  }
  t0 = std::chrono::steady_clock::now();
  if (arrays_path.empty()) {
    body(nullptr);
  } else {
    h5::silence_errors();
    write_atomically(arrays_path, [&](const fs::path& tmp) {
      try {
        H5::H5File file = h5::create_file(tmp.string());
        body(&file);
        if (cfg.accumulation.enabled) runner_steps().write_accumulation_arrays(file, acc);
        file.close();
      } catch (const H5::Exception& e) {
        fail(tmp.string(), ": cannot write: ", h5::describe(e));
      }
    });
  }
  json record = {
      {"format", kCaseFormat},
      {"format_version", kCaseFormatVersion},
      {"case_id", cs.id},
      {"index", cs.index},
      {"input", cs.input},
      {"name", cs.name},
      {"spec", cs.spec},
      {"family", cs.family},
      {"accounting", run.accounting},
      {"slabs", run.slabs},
      {"attention", run.attention},
      {"rows", tidy_rows(run, acc)},
      {"arrays",
       arrays_path.empty() ? json(nullptr) : json("arrays/" + arrays_path.filename().string())}};
  lap("tiles");
  if (cfg.accumulation.enabled) record["accumulation"] = std::move(acc.record);
  // Model-level quality: KLD / perplexity against fp16 with the method in the loop.
  if (cfg.quality.enabled) {
    QualityCase qual = runner_steps().quality_case(cfg, cs);
    for (json& r : qual.rows) record["rows"].push_back(std::move(r));
    record["quality"] = std::move(qual.record);
    lap("quality");
  }
  if (cfg.retrieval.enabled) {
    for (json& r : ret.rows) record["rows"].push_back(std::move(r));
    record["retrieval"] = std::move(ret.record);
  }
  // Per-unit values behind the rows' CIs (paired comparisons in the report use them).
  json units = json::object();
  for (std::size_t ti = 0; ti < run.parts.size(); ++ti)
    units[cfg.data.tiles[ti].name] = run.parts[ti].units.unit_values();
  record["units"] = std::move(units);
  record["bootstrap"] = row_bootstrap_json(cfg.seed, kRowBootstrapUnits);
  record["timing"] = {{"phases", std::move(phases)}};
  return record;
}

namespace {

// The cases of this shard and --only, checked against the config.
std::vector<const CaseSpec*> select_cases(const SweepConfig& cfg, const SweepOptions& opts) {
  std::set<std::string> only(opts.only.begin(), opts.only.end());
  for (const std::string& o : opts.only) {
    const bool known = std::any_of(cfg.cases.begin(), cfg.cases.end(), [&](const CaseSpec& c) {
      return c.id == o || std::to_string(c.index) == o;
    });
    if (!known) {
      std::vector<std::string> ids;
      for (const CaseSpec& c : cfg.cases) ids.push_back(c.id);
      fail("--only ", o, ": no such case (nearest: ", nearest(o, ids), ")");
    }
  }
  std::vector<const CaseSpec*> todo;
  for (const CaseSpec& c : cfg.cases) {
    if (c.index % opts.shard_count != opts.shard_index) continue;
    if (!only.empty() && !only.count(c.id) && !only.count(std::to_string(c.index))) continue;
    todo.push_back(&c);
  }
  return todo;
}

// The run directory's fixed files: resolved config, shard marker, attached throughput results.
void init_run_directory(const SweepConfig& cfg, const SweepOptions& opts, const RunStore& store,
                        const fs::path& run_dir) {
  store.init(cfg.resolved, cfg.config_text);
  if (const int n = store.remove_stale_temporaries()) {
    std::fprintf(opts.log, "removed %d temporary file(s) of an interrupted run\n", n);
  }
  if (opts.shard_count > 1 && !fs::exists(run_dir / "shard.json")) {
    write_text_atomically(
        run_dir / "shard.json",
        json{{"shard", opts.shard_index}, {"of", opts.shard_count}}.dump() + "\n");
  }
  if (!cfg.throughput_results.empty() && !fs::exists(run_dir / "throughput.json")) {
    write_atomically(run_dir / "throughput.json", [&](const fs::path& tmp) {
      fs::copy_file(cfg.throughput_resolved, tmp, fs::copy_options::overwrite_existing);
    });
  }
}

// Provenance of this invocation, written under its digest (which each case records).
std::string write_provenance(const SweepConfig& cfg, const SweepOptions& opts,
                             const fs::path& run_dir, const json& capture_prov) {
  json seeds = {{"config_seed", cfg.seed},
                {"bootstrap", row_bootstrap_json(cfg.seed, kRowBootstrapUnits)}};
  json prov_extra = {{"command", opts.command},
                     {"config", cfg.config_path.string()},
                     {"sets", cfg.sets},
                     {"config_hash", cfg.hash},
                     {"seeds", seeds},
                     {"shard", {{"index", opts.shard_index}, {"count", opts.shard_count}}},
                     {"kvarn_eval_version", "0.1.0"}};
  if (!cfg.data.captures.empty()) prov_extra["capture"] = capture_prov;
  const json prov = collect_provenance(prov_extra);
  const std::string prov_text = prov.dump(2) + "\n";
  const std::string digest = sha256_hex(prov_text).substr(0, 16);
  write_text_atomically(run_dir / "provenance" / (digest + ".json"), prov_text);
  write_text_atomically(run_dir / "provenance.json", prov_text);
  return digest;
}

// Computes and stores one case; its record, written last, marks it finished.
void run_case(const SweepConfig& cfg, const SweepConfig& run_cfg, const CaseSpec& c,
              const RunStore& store, const std::string& digest) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string started = utc_timestamp();
  json record = compute_case(run_cfg, c, cfg.metrics.arrays ? store.arrays_path(c.id) : fs::path());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  json& timing = record["timing"];  // holds the phases of compute_case
  timing["seconds"] = secs;
  timing["started"] = started;
  timing["finished"] = utc_timestamp();
  record["provenance_digest"] = digest;
  record["command"] = reproduce_command(cfg, c.id);
  store.write_case(record);
}

// The Python report of the finished run (a failure is a warning unless strict_report).
void run_report_step(const SweepConfig& cfg, const SweepOptions& opts, SweepResult& res) {
  if (!opts.report || !cfg.report) return;
  if (find_report_script().empty()) {
    KVARN_CHECK(!opts.strict_report, "report: reports/kvarn_report not found");
    std::fprintf(opts.log, "warning: report skipped: reports/kvarn_report not found\n");
    return;
  }
  std::fflush(opts.log);
  res.report_rc = run_report(res.run_dir);
  if (res.report_rc != 0) {
    KVARN_CHECK(!opts.strict_report, "report failed (exit ", res.report_rc, ") for ",
                res.run_dir.string());
    std::fprintf(opts.log, "warning: report failed (exit %d) for %s\n", res.report_rc,
                 res.run_dir.string().c_str());
  }
}

}  // namespace

SweepResult run_sweep(const SweepConfig& cfg, const SweepOptions& opts) {
  KVARN_CHECK(opts.shard_count >= 1 && opts.shard_index >= 0 && opts.shard_index < opts.shard_count,
              "--shard: need 0 <= i < n");
  SweepResult res;
  res.total = static_cast<int>(cfg.cases.size());
  const std::vector<const CaseSpec*> todo = select_cases(cfg, opts);
  res.selected = static_cast<int>(todo.size());

  for (const std::string& n : cfg.notices) std::fprintf(opts.log, "%s\n", n.c_str());
  res.run_dir = run_directory(cfg, opts.shard_index, opts.shard_count, opts.fresh);
  fs::create_directories(res.run_dir);
  RunLock lock(res.run_dir);
  const RunStore store(res.run_dir);
  init_run_directory(cfg, opts, store, res.run_dir);

  std::vector<const CaseSpec*> pending;
  for (const CaseSpec* c : todo) {
    if (store.case_done(c->id, c->spec, cfg.metrics.arrays)) {
      ++res.resumed;
    } else {
      pending.push_back(c);
    }
  }

  // data.capture: the captured files join the data files (first, in order) before any case
  // reads them.
  SweepConfig captured_cfg;
  const SweepConfig* run_cfg = &cfg;
  json capture_prov;
  if (!cfg.data.captures.empty()) {
    const bool any_finished = std::any_of(
        cfg.cases.begin(), cfg.cases.end(),
        [&](const CaseSpec& c) { return store.case_done(c.id, c.spec, cfg.metrics.arrays); });
    captured_cfg = cfg;
    std::vector<TilesSource> captured;
    json provs = json::array();
    for (std::size_t i = 0; i < cfg.data.captures.size(); ++i) {
      const CaptureStep step = prepare_capture(cfg, i, res.run_dir, !pending.empty(), any_finished,
                                               opts.command, opts.log);
      provs.push_back(step.provenance);
      if (step.available) captured.push_back(step.tiles);
    }
    // One capture records its provenance as an object (as before lists existed), several a list.
    capture_prov = provs.size() == 1 ? provs[0] : provs;
    if (!captured.empty()) {
      captured_cfg.data.tiles.insert(captured_cfg.data.tiles.begin(), captured.begin(),
                                     captured.end());
      run_cfg = &captured_cfg;
    }
  }

  // The fp16 reference log-probs of `quality:` are kept in the run directory (resume reuses them).
  SweepConfig quality_cfg;
  if (cfg.quality.enabled) {
    quality_cfg = *run_cfg;
    quality_cfg.quality.cache_dir = res.run_dir / "quality";
    run_cfg = &quality_cfg;
  }
  const std::string digest = write_provenance(cfg, opts, res.run_dir, capture_prov);
  std::fprintf(opts.log, "run directory: %s (%d cases, %d to compute, %d already finished)\n",
               res.run_dir.string().c_str(), res.selected, static_cast<int>(pending.size()),
               res.resumed);
  Progress progress = opts.progress_tty < 0
                          ? Progress(res.selected, res.resumed, opts.log)
                          : Progress(res.selected, res.resumed, opts.log, opts.progress_tty == 1);
  for (const CaseSpec* c : pending) {
    const std::string label = c->id + " " + c->name;
    progress.start_case(label);
    run_case(cfg, *run_cfg, *c, store, digest);
    ++res.computed;
    progress.finish_case(label);
  }
  progress.finish();
  res.finished = store.write_summaries();
  std::fprintf(opts.log, "summary: %s (%d of %d cases)\n",
               (res.run_dir / "summary.jsonl").string().c_str(), res.finished, res.total);
  run_report_step(cfg, opts, res);
  return res;
}

}  // namespace kvarn
