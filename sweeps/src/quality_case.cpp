// Model-level quality in the sweep engine (quality_case.hpp): per case, every model's windows
// through the method's cache against the fp16 reference log-probs kept in the run directory.
#include "quality_case.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kvarn/core/effective_bits.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/read_file.hpp"
#include "kvarn/eval/metrics.hpp"
#include "kvarn/runner/quality.hpp"
#include "kvarn/runner/runner.hpp"
#include "kvarn/sweeps/provenance.hpp"
#include "runner_cache.hpp"

namespace kvarn {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Models and their tokenized text live for the whole process: every case reuses them.
struct Memo {
  std::map<std::string, std::vector<std::int32_t>> ids;
};
Memo& memo() {
  static Memo m;
  return m;
}

const Runner& runner_for(const QualityModel& m, const QualitySettings& q) {
  return shared_runner(m.resolved, q.device, q.threads);
}

// Token ids of a `.jsonl` file: the `token_ids` lists of its records, concatenated (builds
// without a tokenizer, e.g. the GPU image); every id must be below the model's vocabulary.
std::vector<std::int32_t> jsonl_ids(const std::string& text, const QualitySettings& q,
                                    const QualityModel& m) {
  std::vector<std::int32_t> ids;
  std::istringstream in(text);
  int lineno = 0;
  for (std::string line; std::getline(in, line);) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json j = json::parse(line, nullptr, false);
    const std::string where = q.text + ":" + std::to_string(lineno);
    KVARN_CHECK(j.is_object() && j.contains("token_ids") && j["token_ids"].is_array(), where,
                ": expected a JSON object with a token_ids list");
    for (const json& t : j["token_ids"]) {
      KVARN_CHECK(
          t.is_number_integer() && t.get<long long>() >= 0 && t.get<long long>() < m.vocab_size,
          where, ": token id ", t.dump(), " is not in [0, ", m.vocab_size, ") (", m.name,
          "'s vocabulary)");
      ids.push_back(static_cast<std::int32_t>(t.get<long long>()));
    }
  }
  return ids;
}

// The text's token ids with this model's tokenizer (or the ids of a .jsonl file).
const std::vector<std::int32_t>& text_ids(const Runner& r, const QualityModel& m,
                                          const QualitySettings& q) {
  const std::string key = m.resolved.string() + "|" + q.text_fingerprint;
  auto it = memo().ids.find(key);
  if (it == memo().ids.end()) {
    const std::string text = read_regular_file(q.text_resolved, "quality.text");
    const bool jsonl = q.text_resolved.extension() == ".jsonl";
    it = memo().ids.emplace(key, jsonl ? jsonl_ids(text, q, m) : r.encode(text)).first;
  }
  return it->second;
}

QualityOptions options_of(const QualitySettings& q, const QualityModel& m) {
  QualityOptions o;
  o.window = m.window;
  o.block = q.block;
  o.current_token =
      q.current_token == "quantized" ? ChunkAttention::kCache : ChunkAttention::kExact;
  return o;
}

fs::path cache_dir(const QualitySettings& q) {
  if (!q.cache_dir.empty()) return q.cache_dir;
  return fs::temp_directory_path() / ("kvarn-quality-" + std::to_string(::getpid()));
}

// The fp16 reference of window i, computed once (first case) and reused by every later case and
// by a resumed run: keyed by model, text, window index and size, block and policy.
QualityReference reference_for(const Runner& r, const QualityModel& m, const QualitySettings& q,
                               const QualityOptions& o, std::span<const std::int32_t> win,
                               std::size_t i) {
  const std::string key =
      sha256_hex(m.fingerprint + "|" + q.text_fingerprint + "|" + std::to_string(i) + "|" +
                 std::to_string(o.window) + "|" + std::to_string(o.block) + "|" + q.current_token +
                 "|" + q.device + "|float32");
  const fs::path file = cache_dir(q) / "fp16_logprobs" /
                        (m.name + "-w" + std::to_string(i) + "-" + key.substr(0, 16) + ".f32");
  return QualityReference::make(r.model(), win, o, file, key);
}

struct RowContext {
  const CaseSpec& cs;
  const std::string& data;
  double bits, eff;
  const std::string& policy;
  json& rows;
  void add(const std::string& metric, const json& layer, double value) const {
    rows.push_back({{"case_id", cs.id},
                    {"method", cs.name},
                    {"spec", cs.spec},
                    {"family", cs.family},
                    {"data", data},
                    {"bits_per_element", bits},
                    {"effective_bits", eff},
                    {"current_token", policy},
                    {"metric", metric},
                    {"scope", "quality"},
                    {"layer", layer},
                    {"head", "all"},
                    {"value", json_number(value)}});
  }
  // A statistic and, when defined, its CI bounds as `<metric>.ci_lo` / `<metric>.ci_hi`.
  void add_stats(const std::string& prefix, const std::vector<QualityStat>& stats,
                 const json& layer = "all") const {
    for (const QualityStat& s : stats) {
      add(prefix + s.name, layer, s.value);
      if (std::isfinite(s.lo) && std::isfinite(s.hi)) {
        add(prefix + s.name + ".ci_lo", layer, s.lo);
        add(prefix + s.name + ".ci_hi", layer, s.hi);
      }
    }
  }
};

json stats_json(const std::vector<QualityStat>& stats) {
  json o = json::object();
  for (const QualityStat& s : stats) {
    o[s.name] = {{"value", json_number(s.value)},
                 {"ci_lo", json_number(s.lo)},
                 {"ci_hi", json_number(s.hi)}};
  }
  return o;
}

// The statistics of one model's windows: headline (rows reading a quantized token), all rows,
// fp16-only rows, and per position bucket.
json summarize(const std::vector<QualityWindow>& windows, const QualitySettings& q, int window,
               const BootstrapOptions& bo, const RowContext& rc) {
  const QualityRowFilter quantized = [](int, int d) { return d >= 0; };
  const QualityRowFilter all = [](int, int) { return true; };
  const QualityRowFilter fp16_only = [](int, int d) { return d < 0; };
  const auto head = quality_statistics(windows, quantized, bo);
  const auto every = quality_statistics(windows, all, bo);
  const auto fp16 = quality_statistics(windows, fp16_only, bo, false);
  rc.add_stats("quality.", head);
  rc.add_stats("quality.all_rows.", every);
  rc.add_stats("quality.fp16_only_rows.", fp16);
  json buckets = json::array();
  for (int lo = 0; lo < window - 1; lo += q.bucket) {
    const int hi = std::min(lo + q.bucket, window - 1);
    const QualityRowFilter in_bucket = [lo, hi](int t, int) { return t >= lo && t < hi; };
    const auto st = quality_statistics(windows, in_bucket, bo, false);
    rc.add_stats("quality.pos" + std::to_string(lo) + "-" + std::to_string(hi) + ".", st);
    // Per-window means let two buckets be compared paired over windows (same text).
    buckets.push_back({{"begin", lo},
                       {"end", hi},
                       {"stats", stats_json(st)},
                       {"window_means", quality_window_means(windows, in_bucket)}});
  }
  return {{"quantized_rows", stats_json(head)},
          {"all_rows", stats_json(every)},
          {"fp16_only_rows", stats_json(fp16)},
          {"position_buckets", buckets},
          {"window_means", quality_window_means(windows, quantized)},
          {"window_means_all_rows", quality_window_means(windows, all)}};
}

// Per-layer sensitivity: the method on one layer at a time, the first per_layer_windows windows.
json per_layer(const Runner& r, const Method& method, const QualityModel& m,
               const QualitySettings& q, const QualityOptions& o,
               const std::vector<std::span<const std::int32_t>>& wins,
               const std::vector<QualityReference>& refs, const BootstrapOptions& bo,
               const RowContext& rc) {
  const QualityRowFilter all = [](int, int) { return true; };
  json layers = json::array();
  const std::size_t n = std::min<std::size_t>(wins.size(), q.per_layer_windows);
  for (int l = 0; l < m.num_layers; ++l) {
    const std::unique_ptr<Method> one = one_layer_method(method, l);
    std::vector<QualityWindow> res;
    for (std::size_t i = 0; i < n; ++i) {
      res.push_back(run_quality_window(r.model(), refs[i], wins[i], *one, o));
    }
    const auto st = quality_statistics(res, all, bo, false);
    rc.add_stats("quality.layer.", st, l);
    layers.push_back({{"layer", l}, {"windows", n}, {"stats", stats_json(st)}});
  }
  return layers;
}

bool per_layer_selected(const QualitySettings& q, const CaseSpec& cs) {
  if (!q.per_layer) return false;
  if (q.per_layer_methods.empty()) return true;
  return std::find(q.per_layer_methods.begin(), q.per_layer_methods.end(), cs.spec) !=
         q.per_layer_methods.end();
}

// One model: windows, references, the method's runs, statistics and rows.
json run_model(const SweepConfig& cfg, const CaseSpec& cs, const Method& method,
               const QualityModel& m, json& rows) {
  const QualitySettings& q = cfg.quality;
  const Runner& r = runner_for(m, q);
  const QualityOptions o = options_of(q, m);
  const auto wins = quality_windows(text_ids(r, m, q), o.window, m.windows);
  BootstrapOptions bo;
  bo.resamples = q.resamples;
  bo.seed = static_cast<std::uint64_t>(cfg.seed);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<QualityReference> refs;
  std::vector<QualityWindow> res;
  std::uint64_t ref_bytes = 0;
  int reused = 0;
  for (std::size_t i = 0; i < wins.size(); ++i) {
    refs.push_back(reference_for(r, m, q, o, wins[i], i));
    ref_bytes += refs.back().bytes();
    reused += refs.back().reused() ? 1 : 0;
    res.push_back(run_quality_window(r.model(), refs.back(), wins[i], method, o));
  }
  const double eff = model_effective_bits(method, m.head_dim, o.window, m.num_layers);
  const RowContext rc{cs,  m.name,          method.accounting(m.head_dim).bits_per_element(),
                      eff, q.current_token, rows};
  json jm = {{"model", m.name},
             {"path", m.path},
             {"window", o.window},
             {"windows", wins.size()},
             {"block", o.block},
             {"current_token", q.current_token},
             {"effective_bits", eff},
             {"bootstrap", {{"resamples", bo.resamples}, {"seed", bo.seed}, {"level", bo.level}}},
             {"fp16_reference",
              {{"dir", (cache_dir(q) / "fp16_logprobs").string()},
               {"bytes", ref_bytes},
               {"bytes_per_window", wins.empty() ? 0 : ref_bytes / wins.size()},
               {"reused_windows", reused}}},
             {"stats", summarize(res, q, o.window, bo, rc)}};
  if (per_layer_selected(q, cs))
    jm["per_layer"] = per_layer(r, method, m, q, o, wins, refs, bo, rc);
  jm["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return jm;
}

}  // namespace

QualityCase run_quality_case(const SweepConfig& cfg, const CaseSpec& cs) {
  QualityCase out;
  const std::unique_ptr<Method> method = make_method(cs.spec);
  json models = json::array();
  for (const QualityModel& m : cfg.quality.models) {
    try {
      method->check_head_dim(m.head_dim);
    } catch (const Error& e) {
      models.push_back({{"model", m.name}, {"skipped", e.what()}});
      continue;
    }
    models.push_back(run_model(cfg, cs, *method, m, out.rows));
  }
  out.record = {{"models", std::move(models)}, {"text", cfg.quality.text}};
  return out;
}

}  // namespace kvarn
