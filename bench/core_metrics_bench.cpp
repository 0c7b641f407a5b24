// Metrics engine throughput against the quantizer's own, in 128x128 K/V tile pairs per second
// (target: metrics run at >= 50 % of the quantizer's throughput).
//   BM_QuantizeTilePair        kvarn_encode_record (K4 V2, G = D = 128): the quantizer alone
//   BM_QuantizeDecodeTilePair  encode + decode + inverse rotation: what a cache does per tile
//   BM_MetricsTilePair         reconstruction_metrics of K and V (every metric, breakdowns on)
//   BM_StageMetricsTilePair    kvarn_stage_metrics of one tile pair (runs the quantizer itself)
//   BM_AttentionHead           attention metrics of one head, T = Tq = 512, D = 128
#include <benchmark/benchmark.h>

#include <vector>

#include "kvarn/core/kvarn.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/core/rotation.hpp"
#include "kvarn/eval/attention.hpp"
#include "kvarn/eval/metrics.hpp"
#include "kvarn/eval/tile_metrics.hpp"

namespace {

constexpr int kDim = 128;
constexpr int kGroup = 128;

kvarn::Matrix random_tile(int rows, int cols, std::uint64_t seed, bool outliers) {
  kvarn::Rng rng(seed);
  kvarn::Matrix m(rows, cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      double x = rng.normal();
      if (outliers && c % 17 == 0) x += 8.0;  // outlier channels, as real keys have
      m(r, c) = kvarn::round_to_half(static_cast<float>(x));
    }
  return m;
}

struct TilePair {
  kvarn::KvarnConfig cfg;
  kvarn::Rotation rot{kvarn::RotationKind::kHadamard, kDim};
  kvarn::Matrix k = random_tile(kGroup, kDim, 1, true);
  kvarn::Matrix v = random_tile(kGroup, kDim, 2, false);
  kvarn::Matrix k_hat = kvarn::Matrix(kGroup, kDim), v_hat = kvarn::Matrix(kGroup, kDim);
  TilePair() {
    const auto lay = kvarn::kvarn_record_layout(kDim, cfg);
    const auto rec = kvarn::kvarn_encode_record(cfg, rot, k.data(), v.data());
    kvarn::kvarn_decode_stream(kvarn::StreamKind::kKey, lay, rec.data(), k_hat.data());
    kvarn::kvarn_decode_stream(kvarn::StreamKind::kValue, lay, rec.data(), v_hat.data());
    rot.inverse(k_hat.data(), kGroup);
    rot.inverse(v_hat.data(), kGroup);
  }
};

void BM_QuantizeTilePair(benchmark::State& state) {
  TilePair tp;
  for (auto _ : state) {
    auto rec = kvarn::kvarn_encode_record(tp.cfg, tp.rot, tp.k.data(), tp.v.data());
    benchmark::DoNotOptimize(rec.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_QuantizeTilePair);

void BM_QuantizeDecodeTilePair(benchmark::State& state) {
  TilePair tp;
  const auto lay = kvarn::kvarn_record_layout(kDim, tp.cfg);
  std::vector<float> kh(kGroup * kDim), vh(kGroup * kDim);
  for (auto _ : state) {
    auto rec = kvarn::kvarn_encode_record(tp.cfg, tp.rot, tp.k.data(), tp.v.data());
    kvarn::kvarn_decode_stream(kvarn::StreamKind::kKey, lay, rec.data(), kh.data());
    kvarn::kvarn_decode_stream(kvarn::StreamKind::kValue, lay, rec.data(), vh.data());
    tp.rot.inverse(kh.data(), kGroup);
    tp.rot.inverse(vh.data(), kGroup);
    benchmark::DoNotOptimize(kh.data());
    benchmark::DoNotOptimize(vh.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_QuantizeDecodeTilePair);

void BM_MetricsTilePair(benchmark::State& state) {
  TilePair tp;
  kvarn::MetricOptions opts;
  opts.breakdown = state.range(0) != 0;
  for (auto _ : state) {
    auto mk = kvarn::reconstruction_metrics(tp.k.data(), tp.k_hat.data(), kGroup, kDim, opts);
    auto mv = kvarn::reconstruction_metrics(tp.v.data(), tp.v_hat.data(), kGroup, kDim, opts);
    benchmark::DoNotOptimize(mk.nmse);
    benchmark::DoNotOptimize(mv.nmse);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_MetricsTilePair)->Arg(1)->Arg(0)->ArgName("breakdown");

void BM_StageMetricsTilePair(benchmark::State& state) {
  TilePair tp;
  for (auto _ : state) {
    auto r = kvarn::kvarn_stage_metrics(tp.cfg, tp.k, tp.v, 0, 1);
    benchmark::DoNotOptimize(r.key.end_to_end.nmse);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_StageMetricsTilePair);

void BM_AttentionHead(benchmark::State& state) {
  const int t = 512;
  std::vector<kvarn::Matrix> q = {random_tile(t, kDim, 3, false) * 0.1f};
  std::vector<kvarn::Matrix> k = {random_tile(t, kDim, 4, true)},
                             v = {random_tile(t, kDim, 5, false)};
  std::vector<kvarn::Matrix> kh = {k[0]}, vh = {v[0]};
  kvarn::Rng rng(6);
  for (auto* m : {&kh[0], &vh[0]})
    for (Eigen::Index i = 0; i < m->size(); ++i)
      m->data()[i] += static_cast<float>(0.05 * rng.normal());
  kvarn::AttentionOptions opts;
  opts.outlier_percents.clear();
  for (auto _ : state) {
    auto r = kvarn::attention_metrics(q, k, v, kh, vh, opts);
    benchmark::DoNotOptimize(r.summary.kl);
  }
  state.SetItemsProcessed(state.iterations() * t);  // query positions
}
BENCHMARK(BM_AttentionHead)->Unit(benchmark::kMillisecond);

}  // namespace
