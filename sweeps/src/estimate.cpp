// The cost model of `kvarn-eval validate` (docs/config-schema.md, "validate: the estimate").
#include "kvarn/sweeps/estimate.hpp"

#include <algorithm>

#include "kvarn/data/tile_file.hpp"

namespace kvarn {

namespace {

// Cost model of estimate_sweep(), measured on the quickstart (one core of a 2020s x86 server,
// I/O included) and deliberately rough: seconds per token of one (layer, KV head) slab, and
// attention's cost per (query, key) pair per pass (1 + one per outlier level) at D = 128.
constexpr double kReconSecondsPerToken = 4.5e-5;
constexpr double kAttentionSecondsPerTokenPair = 2.0e-7;
constexpr double kCaseJsonBytesPerSlab = 20000;
constexpr double kArrayBytesPerToken = 175;
constexpr double kSummaryBytesPerSlab = 5000;
// Accumulation (model in the loop), per weight byte: a context token in blocks, a decode step.
constexpr double kAccumulationSecondsPerTokenByte = 1.0e-10;
constexpr double kAccumulationSecondsPerStepByte = 1.0e-9;

}  // namespace

SweepEstimate estimate_sweep(const SweepConfig& cfg) {
  SweepEstimate e;
  double per_case_seconds = 0, per_case_bytes = 0;
  // One sequence of one data file: `slabs` (layer, KV head) pairs of `tok` tokens each.
  auto add_sequence = [&](double slabs, double tok, double q_per_kv, bool has_q, int head_dim) {
    if (cfg.data.max_tokens > 0) tok = std::min<double>(tok, cfg.data.max_tokens);
    e.slabs += static_cast<std::int64_t>(slabs);
    e.tokens += static_cast<std::int64_t>(slabs * tok);
    if (cfg.metrics.reconstruction) per_case_seconds += slabs * tok * kReconSecondsPerToken;
    if (cfg.metrics.attention && has_q) {
      const double passes = 1.0 + static_cast<double>(cfg.metrics.outlier_percents.size());
      per_case_seconds += slabs * q_per_kv * passes * tok * tok * kAttentionSecondsPerTokenPair *
                          (head_dim / 128.0);
    }
    per_case_bytes += slabs * (kCaseJsonBytesPerSlab + kSummaryBytesPerSlab);
    if (cfg.metrics.arrays) per_case_bytes += slabs * tok * kArrayBytesPerToken;
  };
  for (const CaptureSpec& cap : cfg.data.captures) {
    const int n = static_cast<int>(cap.sequence_tokens.size());
    const std::vector<int> seqs = cfg.data.sequences.value_or(std::vector<int>());
    const double layers =
        cfg.data.layers ? static_cast<double>(cfg.data.layers->size()) : cap.captured_layers;
    const double heads =
        cfg.data.kv_heads ? static_cast<double>(cfg.data.kv_heads->size()) : cap.num_kv_heads;
    for (int s = 0; s < n; ++s) {
      const double tok = cap.sequence_tokens[static_cast<std::size_t>(s)];
      // The capture: prompt prefill, one decode step per generated token, one capture prefill.
      e.capture_seconds += cap.weight_bytes *
                           (2.0 * tok * kAccumulationSecondsPerTokenByte +
                            std::min<double>(cap.generate, tok) * kAccumulationSecondsPerStepByte);
      e.capture_bytes += tok * cap.captured_layers * cap.head_dim * 2.0 *
                         (3.0 * cap.num_kv_heads + cap.captured_q_heads);
      if (cfg.data.sequences && std::find(seqs.begin(), seqs.end(), s) == seqs.end()) continue;
      add_sequence(layers * heads, tok,
                   static_cast<double>(cap.captured_q_heads) / std::max(1, cap.num_kv_heads),
                   cap.captured_q_heads > 0, cap.head_dim);
    }
  }
  for (const TilesSource& t : cfg.data.tiles) {
    TileReader r(t.resolved);
    const int layers = cfg.data.layers ? static_cast<int>(cfg.data.layers->size())
                                       : r.info().num_captured_layers();
    const int heads =
        cfg.data.kv_heads ? static_cast<int>(cfg.data.kv_heads->size()) : r.info().num_kv_heads;
    std::vector<int> seqs;
    if (cfg.data.sequences) {
      seqs = *cfg.data.sequences;
    } else {
      for (int s = 0; s < r.num_sequences(); ++s) seqs.push_back(s);
    }
    for (int s : seqs) {
      const SequenceInfo& si = r.sequence(s);
      // Captured query heads per KV head (captures may hold a subset of the model's).
      add_sequence(static_cast<double>(layers) * heads, si.num_tokens,
                   static_cast<double>(si.q_heads.size()) / std::max(1, r.info().num_kv_heads),
                   si.has_q, t.head_dim);
    }
  }
  const AccumulationSettings& a = cfg.accumulation;
  if (a.enabled) {
    // Per model: four passes over the context (accumulated, static, two free runs) and three
    // decode runs, each cost ~ weights; the fp16 reference once per model (not per case).
    for (const AccumulationModel& m : a.models) {
      const double passes = (a.pseudo_decode ? 2.0 : 0.0) + (a.free_running ? 2.0 : 0.0) + 1.0;
      const double steps = (a.teacher_forced ? 1.0 : 0.0) + (a.free_running ? 2.0 : 0.0);
      per_case_seconds += static_cast<double>(a.prompt_ids.size()) * m.weight_bytes *
                          (passes * a.context * kAccumulationSecondsPerTokenByte +
                           steps * a.decode_steps * kAccumulationSecondsPerStepByte);
    }
  }
  e.seconds = per_case_seconds * static_cast<double>(cfg.cases.size()) + e.capture_seconds;
  e.bytes = per_case_bytes * static_cast<double>(cfg.cases.size()) + e.capture_bytes;
  return e;
}

}  // namespace kvarn
