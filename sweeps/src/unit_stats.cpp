#include "kvarn/sweeps/unit_stats.hpp"

#include <algorithm>
#include <cmath>

#include "kvarn/data/error.hpp"
#include "kvarn/eval/metrics.hpp"

namespace kvarn {

namespace {

using nlohmann::json;

constexpr int kRowResamples = 2000;
constexpr double kRowLevel = 0.95;

// The per-position arrays of one head, named as the attention summary rows name them.
std::vector<std::pair<std::string, const std::vector<double>*>> named_arrays(
    const PositionMetrics& p, const std::vector<int>& topk) {
  std::vector<std::pair<std::string, const std::vector<double>*>> out = {
      {"kl.mean", &p.kl},
      {"js.mean", &p.js},
      {"logit_mae", &p.logit_mae},
      {"logit_rmse", &p.logit_rmse},
      {"output_nmse", &p.output_nmse}};
  for (std::size_t i = 0; i < topk.size() && i < p.topk_overlap.size(); ++i)
    out.emplace_back("topk_overlap." + std::to_string(topk[i]), &p.topk_overlap[i]);
  return out;
}

}  // namespace

BootstrapOptions row_bootstrap_options(std::int64_t seed) {
  BootstrapOptions o;
  o.resamples = kRowResamples;
  o.level = kRowLevel;
  o.seed = static_cast<std::uint64_t>(seed);
  return o;
}

json row_bootstrap_json(std::int64_t seed, const char* unit) {
  return {{"method", "percentile bootstrap over units"},
          {"seed", seed},
          {"resamples", kRowResamples},
          {"level", kRowLevel},
          {"unit", unit}};
}

void UnitStats::add(const std::string& metric, const std::string& unit, double num, double den) {
  Units& u = metrics_[metric];
  const auto it = std::find(u.ids.begin(), u.ids.end(), unit);
  if (it == u.ids.end()) {
    u.ids.push_back(unit);
    u.num.push_back(num);
    u.den.push_back(den);
    return;
  }
  const std::size_t i = static_cast<std::size_t>(it - u.ids.begin());
  u.num[i] += num;
  u.den[i] += den;
}

std::optional<BootstrapCi> UnitStats::ci(const std::string& metric,
                                         const BootstrapOptions& o) const {
  const auto it = metrics_.find(metric);
  if (it == metrics_.end()) return std::nullopt;
  std::vector<double> num, den;
  for (std::size_t i = 0; i < it->second.ids.size(); ++i) {
    if (!(it->second.den[i] > 0)) continue;
    if (!std::isfinite(it->second.num[i]) || !std::isfinite(it->second.den[i])) return std::nullopt;
    num.push_back(it->second.num[i]);
    den.push_back(it->second.den[i]);
  }
  if (num.size() < 2) return std::nullopt;
  return bootstrap_ratio_ci(num, den, o);
}

json UnitStats::unit_values() const {
  json out = json::object();
  for (const auto& [metric, u] : metrics_) {
    json m = json::object();
    for (std::size_t i = 0; i < u.ids.size(); ++i)
      if (u.den[i] > 0) m[u.ids[i]] = json_number(u.num[i] / u.den[i]);
    if (!m.empty()) out[metric] = std::move(m);
  }
  return out;
}

void add_ci_columns(const std::optional<BootstrapCi>& ci, json& row) {
  if (!ci) return;
  row["ci_lo"] = json_number(ci->lo);
  row["ci_hi"] = json_number(ci->hi);
  row["ci_units"] = ci->samples;
}

void AttentionBuckets::add(const AttentionReport& rep, const std::vector<int>& distances,
                           const std::string& unit, UnitStats* units) {
  const int nb = scheme_.count();
  if (rows_.empty()) rows_.assign(nb, 0);
  for (const HeadAttentionMetrics& h : rep.heads) {
    const auto arrays = named_arrays(h.positions, rep.topk);
    KVARN_CHECK(h.positions.kl.size() == static_cast<std::size_t>(rep.queries),
                "attention buckets: the report holds no per-position metrics");
    if (names_.empty()) {
      for (const auto& a : arrays) names_.push_back(a.first);
      sum_.assign(names_.size(), std::vector<double>(nb, 0.0));
    }
    KVARN_CHECK(arrays.size() == names_.size(), "attention buckets: top-k lists differ");
    std::vector<int> bucket(rep.queries);
    long long head_rows = 0;
    for (int i = 0; i < rep.queries; ++i) {
      const int d = distances.at(static_cast<std::size_t>(rep.q_first + i));
      bucket[i] = scheme_.bucket(d);
      ++rows_[bucket[i]];
      head_rows += d >= 0;
    }
    for (std::size_t m = 0; m < arrays.size(); ++m) {
      double all = 0, headline = 0;
      for (int i = 0; i < rep.queries; ++i) {
        const double x = (*arrays[m].second)[i];
        sum_[m][bucket[i]] += x;
        all += x;
        if (bucket[i] > 0) headline += x;
      }
      units->add("attention." + names_[m], unit, all, rep.queries);
      units->add("attention.headline." + names_[m], unit, headline, static_cast<double>(head_rows));
    }
  }
}

std::vector<std::pair<std::string, double>> AttentionBuckets::metrics() const {
  std::vector<std::pair<std::string, double>> out;
  if (rows_.empty()) return out;
  long long head_rows = 0;
  for (std::size_t b = 1; b < rows_.size(); ++b) head_rows += rows_[b];
  if (head_rows > 0) {
    for (std::size_t m = 0; m < names_.size(); ++m) {
      double s = 0;
      for (std::size_t b = 1; b < rows_.size(); ++b) s += sum_[m][b];
      out.emplace_back("headline." + names_[m], s / static_cast<double>(head_rows));
    }
    out.emplace_back("headline.rows", static_cast<double>(head_rows));
  }
  for (std::size_t b = 0; b < rows_.size(); ++b) {
    if (rows_[b] == 0) continue;
    const std::string prefix = "bucket." + scheme_.label(static_cast<int>(b)) + ".";
    for (std::size_t m = 0; m < names_.size(); ++m)
      out.emplace_back(prefix + names_[m], sum_[m][b] / static_cast<double>(rows_[b]));
    out.emplace_back(prefix + "rows", static_cast<double>(rows_[b]));
  }
  return out;
}

namespace {

// Distance of the row at `position` over a cache of `cache_tokens` tokens of layer l.
int distance_at(const Method& method, int head_dim, int l, int num_layers, int cache_tokens,
                int position) {
  const LayerContext ctx{l, num_layers};
  return quantized_distance(quantized_spans(method, head_dim, cache_tokens, ctx), position);
}

}  // namespace

std::vector<std::vector<int>> block_distances(const Method& method, int head_dim, int num_layers,
                                              const std::vector<int>& context_len,
                                              bool quantized_policy, bool static_cache) {
  std::vector<std::vector<int>> out(context_len.size(), std::vector<int>(num_layers));
  const int final_len = context_len.empty() ? 0 : context_len.back();
  for (std::size_t j = 0; j < context_len.size(); ++j) {
    const int start = j == 0 ? 0 : context_len[j - 1], end = context_len[j];
    for (int l = 0; l < num_layers; ++l) {
      int d;
      if (!static_cache) {
        d = distance_at(method, head_dim, l, num_layers, quantized_policy ? end : start, start);
      } else if (quantized_policy) {
        d = distance_at(method, head_dim, l, num_layers, final_len, start);
      } else {  // rows before start from the final cache; the first row itself is exact
        const int prev =
            start > 0 ? distance_at(method, head_dim, l, num_layers, final_len, start - 1) : -1;
        d = prev >= 0 ? prev + 1 : kReadsNoQuantizedToken;
      }
      out[j][l] = d;
    }
  }
  return out;
}

std::vector<int> decode_step_distances(const Method& method, int head_dim, int num_layers,
                                       int context, int last_block_start, int steps,
                                       bool quantized_policy) {
  std::vector<int> out(static_cast<std::size_t>(std::max(steps, 0)), kReadsNoQuantizedToken);
  for (int t = 0; t < steps; ++t) {
    const int position = context - 1 + t;
    const int cache = quantized_policy ? context + t : (t == 0 ? last_block_start : position);
    for (int l = 0; l < num_layers; ++l) {
      const int d = distance_at(method, head_dim, l, num_layers, cache, position);
      if (d >= 0 && (out[t] < 0 || d < out[t])) out[t] = d;
    }
  }
  return out;
}

}  // namespace kvarn
