// Model-level quality: KLD / perplexity against fp16 with the quantizer in the loop (quality.hpp).
#include "kvarn/runner/quality.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>

#include "kvarn/core/effective_bits.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/data/atomic_file.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/eval/position_buckets.hpp"

namespace kvarn {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr char kMagic[8] = {'K', 'V', 'Q', 'R', 'E', 'F', '1', '\n'};
static_assert(std::endian::native == std::endian::little, "reference files are little-endian");

void check_options(const QualityOptions& o) {
  KVARN_CHECK(o.window >= 2, "quality: window must be >= 2 tokens (got ", o.window, ")");
  KVARN_CHECK(o.block >= 1, "quality: block must be >= 1 (got ", o.block, ")");
}

// Runs `tokens` through `cache` block by block with every row's logits; on_block(start, logits).
template <class F>
void run_blocks(const Model& model, ModelKvCache& cache, std::span<const std::int32_t> tokens,
                const QualityOptions& o, F&& on_block) {
  const int n = static_cast<int>(tokens.size());
  for (int start = 0; start < n; start += o.block) {
    const int len = std::min(o.block, n - start);
    ForwardOptions fo;
    fo.logits = LogitsMode::kAll;
    fo.chunk_attention = o.current_token;
    const ForwardResult r = model.forward(cache, tokens.subspan(start, len), fo);
    on_block(start, r.logits);
  }
}

std::span<const float> row_of(const Matrix& m, Eigen::Index r) {
  return {m.data() + r * m.cols(), static_cast<std::size_t>(m.cols())};
}

int argmax_row(std::span<const float> x) {
  return static_cast<int>(std::max_element(x.begin(), x.end()) - x.begin());
}

// The header's JSON, read from an open file; null when the file is not a reference file.
json read_header(std::ifstream& in, std::uint64_t& data_offset) {
  char magic[8];
  std::uint32_t len = 0;
  if (!in.read(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) return nullptr;
  if (!in.read(reinterpret_cast<char*>(&len), 4) || len > (1u << 20)) return nullptr;
  std::string text(len, '\0');
  if (!in.read(text.data(), len)) return nullptr;
  data_offset = 12 + static_cast<std::uint64_t>(len);
  return json::parse(text, nullptr, false);
}

// Per layer: each stream's policy, or none when the stream stores fp16 (no quantized token).
struct LayerPolicies {
  std::optional<StreamPolicy> key, value;
};

std::vector<LayerPolicies> layer_policies(const Method& method, const ModelConfig& cfg) {
  std::vector<LayerPolicies> out;
  for (int l = 0; l < cfg.num_layers; ++l) {
    const LayerContext ctx{l, cfg.num_layers};
    LayerPolicies p;
    for (const StreamKind kind : {StreamKind::kKey, StreamKind::kValue}) {
      const auto codec = method.make_codec(kind, cfg.head_dim, ctx);
      if (codec->code_bits() < 16.0) {
        (kind == StreamKind::kKey ? p.key : p.value) = codec->policy();
      }
    }
    out.push_back(p);
  }
  return out;
}

// Distance of the row at `position` to the newest quantized token it reads in any layer, with
// `cache_tokens` tokens stored.
int model_distance(const std::vector<LayerPolicies>& layers, int cache_tokens, int position) {
  int best = kReadsNoQuantizedToken;
  for (const LayerPolicies& p : layers) {
    QuantizedSpans s;
    if (p.key) {
      const StreamSpan k = stream_span(*p.key, cache_tokens);
      s.key_begin = k.quantized_begin();
      s.key_end = k.quantized_end();
    }
    if (p.value) {
      const StreamSpan v = stream_span(*p.value, cache_tokens);
      s.value_begin = v.quantized_begin();
      s.value_end = v.quantized_end();
    }
    const int d = quantized_distance(s, position);
    if (d != kReadsNoQuantizedToken && (best == kReadsNoQuantizedToken || d < best)) best = d;
  }
  return best;
}

// The selected predictions of each window.
struct Selected {
  std::vector<std::vector<double>> kld, nll_ref, nll, top1;
};

Selected select_rows(const std::vector<QualityWindow>& windows, const QualityRowFilter& filter) {
  Selected s;
  for (const QualityWindow& w : windows) {
    s.kld.emplace_back();
    s.nll_ref.emplace_back();
    s.nll.emplace_back();
    s.top1.emplace_back();
    for (int t = 0; t < w.size(); ++t) {
      if (!filter(t, w.distance[t])) continue;
      s.kld.back().push_back(w.kld[t]);
      s.nll_ref.back().push_back(w.nll_ref[t]);
      s.nll.back().push_back(w.nll[t]);
      s.top1.back().push_back(w.same_top1[t]);
    }
  }
  return s;
}

// Per-window sums of the selected predictions: resampling windows needs only these for every
// statistic but the quantiles.
struct WindowSums {
  double n = 0, kld = 0, nll_ref = 0, nll = 0, top1 = 0, max = 0;
};

std::vector<WindowSums> window_sums(const Selected& s) {
  std::vector<WindowSums> out(s.kld.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    WindowSums& w = out[i];
    w.n = static_cast<double>(s.kld[i].size());
    for (double x : s.kld[i]) {
      w.kld += x;
      w.max = std::max(w.max, x);
    }
    for (double x : s.nll_ref[i]) w.nll_ref += x;
    for (double x : s.nll[i]) w.nll += x;
    for (double x : s.top1[i]) w.top1 += x;
  }
  return out;
}

// Quantile by linear interpolation (Hyndman-Fan type 7); reorders x.
double quantile_of(std::vector<double>& x, double q) {
  const double h = (static_cast<double>(x.size()) - 1.0) * q;
  const std::size_t lo = static_cast<std::size_t>(std::floor(h));
  std::nth_element(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(lo), x.end());
  const double a = x[lo];
  if (lo + 1 >= x.size()) return a;
  const double b = *std::min_element(x.begin() + static_cast<std::ptrdiff_t>(lo) + 1, x.end());
  return a + (h - static_cast<double>(lo)) * (b - a);
}

// Every statistic (kStatNames' order) of the windows in `pick` (indices, repeats allowed); the
// quantiles only when `quantiles` (else NaN). Empty when no prediction is selected.
std::vector<double> statistics_of(const Selected& s, const std::vector<WindowSums>& sums,
                                  const std::vector<std::size_t>& pick, bool quantiles) {
  WindowSums t;
  for (std::size_t i : pick) {
    const WindowSums& w = sums[i];
    t.n += w.n;
    t.kld += w.kld;
    t.nll_ref += w.nll_ref;
    t.nll += w.nll;
    t.top1 += w.top1;
    if (w.n > 0) t.max = std::max(t.max, w.max);
  }
  if (t.n == 0) return {};
  double med = kNaN, p90 = kNaN, p99 = kNaN;
  if (quantiles) {
    std::vector<double> kld;
    kld.reserve(static_cast<std::size_t>(t.n));
    for (std::size_t i : pick) kld.insert(kld.end(), s.kld[i].begin(), s.kld[i].end());
    med = quantile_of(kld, 0.5);
    p90 = quantile_of(kld, 0.9);
    p99 = quantile_of(kld, 0.99);
  }
  const double ppl_ref = std::exp(t.nll_ref / t.n), ppl = std::exp(t.nll / t.n);
  return {t.kld / t.n, med, p90, p99, t.max, ppl_ref, ppl, std::exp((t.nll - t.nll_ref) / t.n),
          ppl - ppl_ref, 100.0 * t.top1 / t.n};
}

const char* const kStatNames[] = {"kld.mean", "kld.median", "kld.p90",   "kld.p99",
                                  "kld.max",  "ppl_ref",    "ppl",       "ppl_ratio",
                                  "delta_ppl", "same_top1"};

// A method quantizing one layer (one_layer_method).
class OneLayerMethod final : public Method {
 public:
  OneLayerMethod(const Method& inner, int layer)
      : inner_(make_method(inner.spec())), fp16_(make_method("fp16")), layer_(layer) {}
  std::string name() const override { return inner_->name() + "@layer" + std::to_string(layer_); }
  std::string spec() const override { return inner_->spec() + "@layer=" + std::to_string(layer_); }
  std::string family() const override { return inner_->family(); }
  std::string description() const override {
    return inner_->description() + " (layer " + std::to_string(layer_) + " only)";
  }
  void check_head_dim(int head_dim) const override { inner_->check_head_dim(head_dim); }
  std::unique_ptr<StreamCodec> make_codec(StreamKind kind, int head_dim,
                                          const LayerContext& layer) const override {
    return (layer.layer == layer_ ? *inner_ : *fp16_).make_codec(kind, head_dim, layer);
  }
  bool layer_skipped(const LayerContext& layer) const override {
    return layer.layer != layer_ || inner_->layer_skipped(layer);
  }

 private:
  std::unique_ptr<Method> inner_, fp16_;
  int layer_;
};

}  // namespace

void log_softmax_row(std::span<const float> logits, std::span<float> out) {
  KVARN_CHECK(!logits.empty() && out.size() == logits.size(), "log_softmax_row: size mismatch");
  const double m = *std::max_element(logits.begin(), logits.end());
  KVARN_CHECK(std::isfinite(m), "log_softmax_row: non-finite logits");
  double s = 0;
  for (float v : logits) s += std::exp(static_cast<double>(v) - m);
  const double lse = m + std::log(s);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    out[i] = static_cast<float>(static_cast<double>(logits[i]) - lse);
  }
}

double kl_from_log_probs(std::span<const float> log_p, std::span<const float> log_q) {
  KVARN_CHECK(log_p.size() == log_q.size() && !log_p.empty(), "kl_from_log_probs: sizes ",
              log_p.size(), " and ", log_q.size());
  double kl = 0;
  for (std::size_t i = 0; i < log_p.size(); ++i) {
    const double a = log_p[i], b = log_q[i];
    if (a != b) kl += std::exp(a) * (a - b);
  }
  return std::max(0.0, kl);
}

QualityReference QualityReference::make(const Model& model, std::span<const std::int32_t> tokens,
                                         const QualityOptions& o, const fs::path& file,
                                         const std::string& key) {
  check_options(o);
  KVARN_CHECK(static_cast<int>(tokens.size()) == o.window, "quality: window of ", tokens.size(),
              " tokens, expected ", o.window);
  QualityReference ref;
  ref.file_ = file;
  ref.key_ = key;
  ref.rows_ = o.window - 1;
  ref.vocab_ = model.config().vocab_size;
  const std::uint64_t data_bytes = static_cast<std::uint64_t>(ref.rows_) * ref.vocab_ * 4;
  std::error_code ec;
  if (fs::is_regular_file(file, ec)) {
    std::ifstream in(file, std::ios::binary);
    std::uint64_t off = 0;
    const json h = read_header(in, off);
    if (h.is_object() && h.value("key", "") == key && fs::file_size(file, ec) == off + data_bytes) {
      ref.data_offset_ = off;
      ref.reused_ = true;
      return ref;
    }
  }
  const std::string header = json{{"key", key},
                                  {"rows", ref.rows_},
                                  {"vocab", ref.vocab_},
                                  {"block", o.block},
                                  {"current_token", o.current_token == ChunkAttention::kCache
                                                        ? "quantized"
                                                        : "exact"},
                                  {"format", "float32 log_softmax rows, little-endian"}}
                                 .dump();
  ref.data_offset_ = 12 + header.size();
  fs::create_directories(file.parent_path());
  write_atomically(file, [&](const fs::path& tmp) {
    std::ofstream out(tmp, std::ios::binary);
    const std::uint32_t len = static_cast<std::uint32_t>(header.size());
    out.write(kMagic, 8);
    out.write(reinterpret_cast<const char*>(&len), 4);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    ModelKvCache cache = model.make_cache("exact_fp16");
    std::vector<float> lp(static_cast<std::size_t>(ref.vocab_));
    run_blocks(model, cache, tokens, o, [&](int start, const Matrix& logits) {
      for (Eigen::Index r = 0; r < logits.rows(); ++r) {
        if (start + r >= ref.rows_) break;  // the last position predicts nothing
        log_softmax_row(row_of(logits, r), lp);
        out.write(reinterpret_cast<const char*>(lp.data()),
                  static_cast<std::streamsize>(lp.size() * 4));
      }
    });
    out.flush();
    KVARN_CHECK(out.good(), tmp.string(), ": cannot write the fp16 reference log-probs");
  });
  return ref;
}

std::uint64_t QualityReference::bytes() const {
  std::error_code ec;
  const auto n = fs::file_size(file_, ec);
  return ec ? 0 : static_cast<std::uint64_t>(n);
}

void QualityReference::read(int first, int n, float* out) const {
  KVARN_CHECK(first >= 0 && n >= 0 && first + n <= rows_, file_.string(), ": rows [", first, ", ",
              first + n, ") outside [0, ", rows_, ")");
  std::ifstream in(file_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_offset_ +
                                       static_cast<std::uint64_t>(first) * vocab_ * 4));
  in.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(n) * vocab_ * 4);
  KVARN_CHECK(in.good(), file_.string(), ": fp16 reference log-probs truncated (rows ", first,
              " + ", n, ")");
}

QualityWindow run_quality_window(const Model& model, const QualityReference& ref,
                                 std::span<const std::int32_t> tokens, const Method& method,
                                 const QualityOptions& o) {
  check_options(o);
  const ModelConfig& cfg = model.config();
  KVARN_CHECK(static_cast<int>(tokens.size()) == ref.rows() + 1 && ref.vocab() == cfg.vocab_size,
              "quality: ", ref.file().string(), " was made for another window or model");
  method.check_head_dim(cfg.head_dim);
  ModelKvCache cache(cfg.kv_geometry(), method);
  cache.set_placement(KvPlacement::kHost);
  const std::vector<LayerPolicies> policies = layer_policies(method, cfg);
  QualityWindow w;
  const int V = cfg.vocab_size;
  std::vector<float> ref_rows, lq(static_cast<std::size_t>(V));
  run_blocks(model, cache, tokens, o, [&](int start, const Matrix& logits) {
    const int n = std::min(static_cast<int>(logits.rows()), ref.rows() - start);
    if (n <= 0) return;
    ref_rows.resize(static_cast<std::size_t>(n) * V);
    ref.read(start, n, ref_rows.data());
    // The cache the block's rows read: before the block (exact) or with it (quantized).
    const int cache_tokens =
        o.current_token == ChunkAttention::kCache ? start + static_cast<int>(logits.rows()) : start;
    for (int r = 0; r < n; ++r) {
      const int t = start + r;
      log_softmax_row(row_of(logits, r), lq);
      const std::span<const float> lp(ref_rows.data() + static_cast<std::size_t>(r) * V,
                                      static_cast<std::size_t>(V));
      const std::int32_t next = tokens[static_cast<std::size_t>(t) + 1];
      w.kld.push_back(kl_from_log_probs(lp, lq));
      w.nll_ref.push_back(-static_cast<double>(lp[static_cast<std::size_t>(next)]));
      w.nll.push_back(-static_cast<double>(lq[static_cast<std::size_t>(next)]));
      w.same_top1.push_back(argmax_row(lp) == argmax_row(lq) ? 1 : 0);
      w.distance.push_back(model_distance(policies, cache_tokens, t));
    }
  });
  return w;
}

std::unique_ptr<Method> one_layer_method(const Method& inner, int layer) {
  KVARN_CHECK(layer >= 0, "one_layer_method: negative layer ", layer);
  return std::make_unique<OneLayerMethod>(inner, layer);
}

std::vector<std::span<const std::int32_t>> quality_windows(std::span<const std::int32_t> ids,
                                                           int window, int count) {
  KVARN_CHECK(window >= 2, "quality: window must be >= 2 tokens (got ", window, ")");
  KVARN_CHECK(count >= 0, "quality: negative window count ", count);
  const int fit = static_cast<int>(ids.size() / static_cast<std::size_t>(window));
  KVARN_CHECK(fit >= 1 && fit >= count, "quality: the text holds ", ids.size(), " tokens: ", fit,
              " window(s) of ", window, ", ", count > 0 ? count : 1, " needed");
  std::vector<std::span<const std::int32_t>> out;
  for (int i = 0; i < (count > 0 ? count : fit); ++i) {
    out.push_back(ids.subspan(static_cast<std::size_t>(i) * window, window));
  }
  return out;
}

std::vector<QualityStat> quality_statistics(const std::vector<QualityWindow>& windows,
                                            const QualityRowFilter& filter,
                                            const BootstrapOptions& bo, bool quantile_ci) {
  const Selected s = select_rows(windows, filter);
  const std::vector<WindowSums> sums = window_sums(s);
  std::vector<std::size_t> all(windows.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  const std::vector<double> point = statistics_of(s, sums, all, true);
  if (point.empty()) return {};
  const std::size_t K = point.size();
  std::vector<std::vector<double>> boot(K);
  if (windows.size() >= 2) {
    std::vector<std::size_t> pick(windows.size());
    for (int b = 0; b < bo.resamples; ++b) {
      Rng rng(bootstrap_stream_seed(bo.seed, static_cast<std::uint64_t>(b)));
      for (std::size_t& p : pick) {
        p = std::min(windows.size() - 1,
                     static_cast<std::size_t>(rng.uniform() * static_cast<double>(windows.size())));
      }
      const std::vector<double> v = statistics_of(s, sums, pick, quantile_ci);
      if (v.empty()) continue;  // every drawn window lacks selected rows
      for (std::size_t k = 0; k < K; ++k) boot[k].push_back(v[k]);
    }
  }
  std::vector<QualityStat> out;
  const double a = (1.0 - bo.level) / 2.0;
  for (std::size_t k = 0; k < K; ++k) {
    QualityStat st{kStatNames[k], point[k], kNaN, kNaN};
    std::vector<double> finite;
    for (double x : boot[k])
      if (std::isfinite(x)) finite.push_back(x);
    if (finite.size() >= 2) {
      st.lo = quantile_of(finite, a);
      st.hi = quantile_of(finite, 1.0 - a);
    }
    out.push_back(st);
  }
  double tokens = 0;
  for (const auto& k : s.kld) tokens += static_cast<double>(k.size());
  out.push_back({"tokens", tokens, kNaN, kNaN});
  return out;
}

json quality_window_means(const std::vector<QualityWindow>& windows,
                          const QualityRowFilter& filter) {
  const Selected s = select_rows(windows, filter);
  auto mean = [](const std::vector<double>& v) {
    if (v.empty()) return json(nullptr);
    double t = 0;
    for (double x : v) t += x;
    return json(t / static_cast<double>(v.size()));
  };
  json out = {{"kld", json::array()},
              {"nll_ref", json::array()},
              {"nll", json::array()},
              {"same_top1", json::array()},
              {"tokens", json::array()}};
  for (std::size_t i = 0; i < windows.size(); ++i) {
    out["kld"].push_back(mean(s.kld[i]));
    out["nll_ref"].push_back(mean(s.nll_ref[i]));
    out["nll"].push_back(mean(s.nll[i]));
    out["same_top1"].push_back(mean(s.top1[i]));
    out["tokens"].push_back(s.kld[i].size());
  }
  return out;
}

}  // namespace kvarn
