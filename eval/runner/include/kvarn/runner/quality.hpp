// Model-level quality against fp16 with the quantizer in the loop (docs/metrics.md, "Model-level
// quality"): KL divergence and perplexity over windows of held-out text, as llama.cpp's
// `perplexity --kl-divergence` reports them, with bootstrap confidence intervals over windows.
//
// A window of T tokens is processed exactly as a decoder would: pseudo-decode blocks of b tokens,
// each attending to the method's cache of everything before it and then writing its own K/V
// (quantized by the method's policy), under the configured current-token policy
// (accumulation.hpp). The fp16 run processes the same tokens with the same blocks over an exact
// fp16 cache (bit-identical to the `fp16` method), so the `fp16` method gives KLD exactly 0.
// Position t of the window predicts token t + 1: T - 1 predictions per window, each giving
//   KLD(p_fp16 || p_method), NLL of the true next token under both, same top-1.
//
// The fp16 run's log-probs are computed once per window and kept in a file (QualityReference:
// (T - 1) x vocab float32 rows, 4 * (T - 1) * vocab bytes plus a header), reused by every method
// and by a resumed run; a file whose header does not match its key is recomputed. Memory stays
// bounded by one block: [b, vocab] logits and [b, T] attention scores per forward call.
// This header is torch-free (kvarn_runner).
#ifndef KVARN_RUNNER_QUALITY_HPP_
#define KVARN_RUNNER_QUALITY_HPP_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "kvarn/core/method.hpp"
#include "kvarn/eval/bootstrap.hpp"
#include "kvarn/runner/model.hpp"

namespace kvarn {

struct QualityOptions {
  int window = 2048;  // tokens per window
  int block = 32;     // pseudo-decode block (tokens per forward call)
  ChunkAttention current_token = ChunkAttention::kExact;
};

// Log-softmax of one logits row, computed in double and rounded to float (both runs use it, so
// identical logits give identical log-probs).
void log_softmax_row(std::span<const float> logits, std::span<float> out);

// KL(p || q) in nats from two log-prob rows, in double; exactly 0 for identical rows, clamped
// at 0 against rounding.
double kl_from_log_probs(std::span<const float> log_p, std::span<const float> log_q);

// The fp16 run's log-probs of one window, in a file (see above).
class QualityReference {
 public:
  // Reuses `file` when its header holds `key` and its size is right; otherwise runs the fp16
  // model over `tokens` and writes the file (temporary + rename). Throws kvarn::Error naming the
  // file when it cannot be written.
  static QualityReference make(const Model& model, std::span<const std::int32_t> tokens,
                               const QualityOptions& options, const std::filesystem::path& file,
                               const std::string& key);
  int rows() const { return rows_; }  // window - 1
  int vocab() const { return vocab_; }
  bool reused() const { return reused_; }
  const std::filesystem::path& file() const { return file_; }
  std::uint64_t bytes() const;  // file size
  // Rows [first, first + n) into out (n * vocab floats). Throws on a short or changed file.
  void read(int first, int n, float* out) const;

 private:
  std::filesystem::path file_;
  std::string key_;
  int rows_ = 0, vocab_ = 0;
  std::uint64_t data_offset_ = 0;
  bool reused_ = false;
};

// Per prediction t = 0 .. window - 2 (position t predicts token t + 1).
struct QualityWindow {
  std::vector<double> kld;            // KL(p_fp16 || p_method), nats
  std::vector<double> nll_ref, nll;   // -log p(token t + 1): fp16 run, method run
  std::vector<std::uint8_t> same_top1;  // 1 when both runs' argmax agree
  // Distance to the newest quantized token row t reads in any layer (kvarn/eval/
  // position_buckets.hpp); -1 (kReadsNoQuantizedToken) when it reads none.
  std::vector<int> distance;
  int size() const { return static_cast<int>(kld.size()); }
};

// Runs one window through `method`'s cache (host placement) and compares with `ref`.
QualityWindow run_quality_window(const Model& model, const QualityReference& ref,
                                 std::span<const std::int32_t> tokens, const Method& method,
                                 const QualityOptions& options);

// A method that quantizes only model layer `layer` with `inner`; every other layer stores fp16
// (per-layer sensitivity). Its spec() is `<inner spec>@layer=<l>`, which the registry does not
// parse: use the object itself.
std::unique_ptr<Method> one_layer_method(const Method& inner, int layer);

// Consecutive non-overlapping windows of `window` tokens from the start of `ids`: `count` of them
// (0: as many as fit). Throws kvarn::Error when fewer than `count` (or none) fit.
std::vector<std::span<const std::int32_t>> quality_windows(std::span<const std::int32_t> ids,
                                                           int window, int count);

// One statistic with its bootstrap CI over windows (lo = hi = NaN with fewer than 2 windows).
struct QualityStat {
  std::string name;
  double value = 0, lo = 0, hi = 0;
};

// Which predictions a statistic covers: (position t, distance) -> selected.
using QualityRowFilter = std::function<bool(int position, int distance)>;

// llama.cpp's statistics over the selected predictions of all windows, pooled over tokens:
//   kld.mean, kld.median, kld.p90, kld.p99, kld.max (nats), ppl_ref, ppl, ppl_ratio (= exp of
//   mean(nll - nll_ref)), delta_ppl (ppl - ppl_ref), same_top1 (percent), tokens (count).
// Each (but tokens) with a percentile-bootstrap CI: windows resampled with replacement (the
// unit: a window; seeded as eval's bootstrap, kvarn/eval/bootstrap.hpp). The quantiles' CIs
// re-pool every resample's predictions; without `quantile_ci` they have none (lo = hi = NaN),
// which makes the statistics of many buckets cheap. Empty when no prediction is selected.
std::vector<QualityStat> quality_statistics(const std::vector<QualityWindow>& windows,
                                            const QualityRowFilter& filter,
                                            const BootstrapOptions& options = {},
                                            bool quantile_ci = true);

// Per window: mean KLD, mean NLL (both runs) and same-top-1 share of the selected predictions
// (the report's paired bootstrap between methods); NaN for a window with none selected.
nlohmann::json quality_window_means(const std::vector<QualityWindow>& windows,
                                    const QualityRowFilter& filter);

}  // namespace kvarn

#endif  // KVARN_RUNNER_QUALITY_HPP_
