#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "attention_test_util.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/eval/attention.hpp"
#include "test_util.hpp"

namespace kvarn {
namespace {

using testing::add_noise;

using Layer = testing::AttentionLayer;

// Hq query heads over Hkv KV heads, T tokens, a query per position; K̂, V̂ = exact + noise.
Layer make_layer(int hq, int hkv, int t, int d, double noise, std::uint64_t seed) {
  return testing::make_attention_layer(hq, hkv, t, t, d, noise, seed);
}

AttentionReport measure(const Layer& l, AttentionOptions opts = {}) {
  return attention_metrics(l.q, l.k, l.v, l.kh, l.vh, opts);
}

TEST(Attention, KlOfPermutedLogitsByHand) {
  // p = softmax(1,2,3,4), p̂ = softmax(4,3,2,1) = p reversed: log(p_i / p̂_i) = i - (5 - i).
  const std::vector<double> s = {1, 2, 3, 4}, sh = {4, 3, 2, 1};
  double z = 0, num = 0;
  for (int i = 1; i <= 4; ++i) z += std::exp(i), num += (2.0 * i - 5.0) * std::exp(i);
  EXPECT_NEAR(kl_from_logits(s, sh), num / z, 1e-14);
  // By symmetry KL(p̂‖p) is the same; JS by its definition with m = (p + p̂)/2.
  EXPECT_NEAR(kl_from_logits(sh, s), num / z, 1e-14);
  double js = 0;
  for (int i = 1; i <= 4; ++i) {
    const double p = std::exp(i) / z, ph = std::exp(5 - i) / z, m = 0.5 * (p + ph);
    js += 0.5 * (p * std::log(p / m) + ph * std::log(ph / m));
  }
  EXPECT_NEAR(js_from_logits(s, sh), js, 1e-14);
  // A constant shift of the logits leaves the distribution unchanged.
  const std::vector<double> shifted = {11, 12, 13, 14};
  EXPECT_NEAR(kl_from_logits(s, shifted), 0.0, 1e-15);
  EXPECT_EQ(kl_from_logits(s, s), 0.0);
  EXPECT_EQ(js_from_logits(s, s), 0.0);
}

TEST(Attention, TopkOverlapByHand) {
  std::vector<double> s(10), sh(10);
  for (int i = 0; i < 10; ++i) s[i] = sh[i] = i;
  EXPECT_EQ(topk_overlap(s, sh, 3), 1.0);
  std::swap(sh[9], sh[0]);  // top-1 of ŝ is now index 0
  EXPECT_EQ(topk_overlap(s, sh, 1), 0.0);
  EXPECT_DOUBLE_EQ(topk_overlap(s, sh, 3), 2.0 / 3.0);  // {9,8,7} vs {0,8,7}
  EXPECT_EQ(topk_overlap(s, sh, 10), 1.0);              // row not longer than k
}

TEST(Attention, IdentityReconstructionIsExact) {
  const Layer l = make_layer(2, 1, 80, 32, 0.0, 1);
  const AttentionReport r = measure(l);
  EXPECT_EQ(r.summary.count, 2 * 80);
  EXPECT_EQ(r.summary.kl, 0.0);
  EXPECT_EQ(r.summary.kl_max, 0.0);
  EXPECT_EQ(r.summary.js, 0.0);
  EXPECT_EQ(r.summary.logit_mae, 0.0);
  EXPECT_EQ(r.summary.logit_rmse, 0.0);
  EXPECT_EQ(r.summary.output_nmse, 0.0);
  ASSERT_EQ(r.summary.topk_overlap.size(), 3u);
  for (double o : r.summary.topk_overlap) EXPECT_EQ(o, 1.0);
  for (const auto& o : r.outliers) EXPECT_EQ(o.kl, 0.0);
  const std::string js = nlohmann::json(r).dump();
  EXPECT_EQ(js.find("nan"), std::string::npos);
  EXPECT_EQ(js.find("null"), std::string::npos);
}

TEST(Attention, MatchesIndependentDoubleComputation) {
  const int t = 70, d = 16;
  const Layer l = make_layer(1, 1, t, d, 0.2, 2);
  AttentionOptions opts;
  opts.block = 16;  // several blocks, a partial last one
  const AttentionReport r = measure(l, opts);
  const auto& pm = r.heads[0].positions;
  ASSERT_EQ(pm.kl.size(), static_cast<std::size_t>(t));
  for (int pos : {0, 1, 15, 16, 40, 69}) {
    const int n = pos + 1;
    std::vector<double> s(n), sh(n);
    double mae = 0, mse = 0;
    for (int j = 0; j < n; ++j) {
      double a = 0, b = 0;
      for (int c = 0; c < d; ++c) {
        a += static_cast<double>(l.q[0](pos, c)) * l.k[0](j, c);
        b += static_cast<double>(l.q[0](pos, c)) * l.kh[0](j, c);
      }
      s[j] = a / std::sqrt(d);
      sh[j] = b / std::sqrt(d);
      mae += std::fabs(s[j] - sh[j]);
      mse += (s[j] - sh[j]) * (s[j] - sh[j]);
    }
    double mx = s[0], mxh = sh[0];
    for (int j = 0; j < n; ++j) mx = std::max(mx, s[j]), mxh = std::max(mxh, sh[j]);
    std::vector<double> p(n), ph(n);
    double z = 0, zh = 0;
    for (int j = 0; j < n; ++j)
      z += p[j] = std::exp(s[j] - mx), zh += ph[j] = std::exp(sh[j] - mxh);
    double kl = 0, js = 0, onum = 0, oden = 0;
    for (int j = 0; j < n; ++j) {
      p[j] /= z, ph[j] /= zh;
      kl += p[j] * std::log(p[j] / ph[j]);
      const double m = 0.5 * (p[j] + ph[j]);
      js += 0.5 * (p[j] * std::log(p[j] / m) + ph[j] * std::log(ph[j] / m));
    }
    for (int c = 0; c < d; ++c) {
      double o = 0, oh = 0;
      for (int j = 0; j < n; ++j) o += p[j] * l.v[0](j, c), oh += ph[j] * l.vh[0](j, c);
      onum += (o - oh) * (o - oh), oden += o * o;
    }
    EXPECT_NEAR(pm.logit_mae[pos], mae / n, 1e-12) << pos;
    EXPECT_NEAR(pm.logit_rmse[pos], std::sqrt(mse / n), 1e-12) << pos;
    EXPECT_NEAR(pm.kl[pos], std::max(0.0, kl), 1e-12 + 1e-9 * kl) << pos;
    EXPECT_NEAR(pm.js[pos], js, 1e-12 + 1e-9 * js) << pos;
    EXPECT_NEAR(pm.output_nmse[pos], onum / oden, 1e-9 * onum / oden + 1e-15) << pos;
  }
  EXPECT_GT(r.summary.kl, 0.0);
  EXPECT_LT(r.summary.topk_overlap[0], 1.0 + 1e-15);
}

// Blocks of query rows run on worker threads: every per-position value, summary and outlier KL
// is the same bits with 1, 2 and 5 threads (5 > blocks of the short head: clamped).
TEST(Attention, ThreadCountDoesNotChangeAnyValue) {
  const Layer l = make_layer(4, 2, 150, 16, 0.2, 9);
  AttentionOptions opts;
  opts.block = 16;
  opts.outlier_percents = {1.0};
  opts.threads = 1;
  const AttentionReport one = measure(l, opts);
  for (int threads : {2, 5}) {
    opts.threads = threads;
    const AttentionReport r = measure(l, opts);
    ASSERT_EQ(r.heads.size(), one.heads.size());
    for (std::size_t h = 0; h < r.heads.size(); ++h) {
      const PositionMetrics &a = one.heads[h].positions, &b = r.heads[h].positions;
      EXPECT_EQ(a.kl, b.kl) << threads << " threads, head " << h;
      EXPECT_EQ(a.js, b.js) << threads << " threads, head " << h;
      EXPECT_EQ(a.logit_mae, b.logit_mae);
      EXPECT_EQ(a.logit_rmse, b.logit_rmse);
      EXPECT_EQ(a.output_nmse, b.output_nmse);
      EXPECT_EQ(a.topk_overlap, b.topk_overlap);
    }
    EXPECT_EQ(r.summary.kl, one.summary.kl);
    EXPECT_EQ(r.summary.js, one.summary.js);
    ASSERT_EQ(r.outliers.size(), 1u);
    EXPECT_EQ(r.outliers[0].kl, one.outliers[0].kl);
  }
  EXPECT_GT(one.summary.kl, 0.0);
}

TEST(Attention, ReferenceAttentionIsCausalSoftmax) {
  const Layer l = make_layer(1, 1, 40, 8, 0.0, 3);
  const MatrixD o = reference_attention(l.q[0], l.k[0], l.v[0]);
  // Position 0 attends only to key 0: output = v_0.
  for (int c = 0; c < 8; ++c) EXPECT_NEAR(o(0, c), l.v[0](0, c), 1e-12);
  // Future keys do not change earlier outputs.
  Matrix k2 = l.k[0], v2 = l.v[0];
  k2.bottomRows(20).setConstant(5.0f);
  v2.bottomRows(20).setConstant(-3.0f);
  const MatrixD o2 = reference_attention(l.q[0], k2, v2);
  EXPECT_EQ(o.topRows(20), o2.topRows(20));
  EXPECT_NE(o.bottomRows(20), o2.bottomRows(20));
  // Last 10 queries at positions 30..39 equal the corresponding rows of the full run.
  const Matrix qlast = l.q[0].bottomRows(10);
  const MatrixD o3 = reference_attention(qlast, l.k[0], l.v[0]);
  EXPECT_LT((o3 - o.bottomRows(10)).cwiseAbs().maxCoeff(), 1e-12);
}

TEST(Attention, CausalMaskFutureKeysDoNotChangeEarlierPositions) {
  const int t = 96, t0 = 50;
  Layer a = make_layer(2, 1, t, 16, 0.1, 4);
  Layer b = a;
  for (Matrix* m : {&b.kh[0], &b.vh[0], &b.k[0], &b.v[0]})
    m->bottomRows(t - t0 - 1) = add_noise(m->bottomRows(t - t0 - 1), 2.0, 9);
  AttentionOptions opts;
  opts.outlier_percents.clear();
  const AttentionReport ra = measure(a, opts), rb = measure(b, opts);
  for (int h = 0; h < 2; ++h) {
    const auto& pa = ra.heads[h].positions;
    const auto& pb = rb.heads[h].positions;
    bool later_differs = false;
    for (int i = 0; i < t; ++i) {
      if (i <= t0) {
        EXPECT_EQ(pa.kl[i], pb.kl[i]) << i;
        EXPECT_EQ(pa.js[i], pb.js[i]) << i;
        EXPECT_EQ(pa.logit_mae[i], pb.logit_mae[i]) << i;
        EXPECT_EQ(pa.output_nmse[i], pb.output_nmse[i]) << i;
        EXPECT_EQ(pa.topk_overlap[2][i], pb.topk_overlap[2][i]) << i;
      } else {
        later_differs |= pa.kl[i] != pb.kl[i];
      }
    }
    EXPECT_TRUE(later_differs);
  }
}

TEST(Attention, GqaMapsQueryHeadsToKvHeads) {
  // Hq = 4, Hkv = 2: only KV head 1 is perturbed, so only query heads 2 and 3 see error.
  Layer l = make_layer(4, 2, 64, 16, 0.0, 5);
  l.kh[1] = add_noise(l.k[1], 0.3, 11);
  l.vh[1] = add_noise(l.v[1], 0.3, 12);
  const AttentionReport r = measure(l);
  ASSERT_EQ(r.heads.size(), 4u);
  const int expect_kv[] = {0, 0, 1, 1};
  for (int h = 0; h < 4; ++h) {
    EXPECT_EQ(r.heads[h].kv_head, expect_kv[h]);
    if (expect_kv[h] == 0) {
      EXPECT_EQ(r.heads[h].summary.kl, 0.0) << h;
      EXPECT_EQ(r.heads[h].summary.output_nmse, 0.0) << h;
    } else {
      EXPECT_GT(r.heads[h].summary.kl, 0.0) << h;
      EXPECT_GT(r.heads[h].summary.output_nmse, 0.0) << h;
    }
  }
  // Each head equals a single-head run on its own KV head.
  Layer one;
  one.q = {l.q[3]};
  one.k = {l.k[1]};
  one.v = {l.v[1]};
  one.kh = {l.kh[1]};
  one.vh = {l.vh[1]};
  const AttentionReport r1 = measure(one);
  EXPECT_EQ(r1.heads[0].positions.kl, r.heads[3].positions.kl);
  EXPECT_EQ(r1.heads[0].positions.output_nmse, r.heads[3].positions.output_nmse);
  // Layer mean over the four heads.
  EXPECT_NEAR(r.summary.kl, 0.25 * (r.heads[2].summary.kl + r.heads[3].summary.kl), 1e-15);
  // Query heads that do not divide evenly are rejected.
  l.q.pop_back();
  EXPECT_THROW(measure(l), Error);
}

TEST(Attention, PositionBucketsPartitionPositions) {
  const Layer l = make_layer(1, 1, 100, 16, 0.1, 6);
  AttentionOptions opts;
  opts.q_first = 36;  // Tq = 64 rows at positions 36..99 (must equal T - Tq here)
  Layer last = l;
  last.q[0] = l.q[0].bottomRows(64);
  const AttentionReport r = measure(last, opts);
  EXPECT_EQ(r.q_first, 36);
  std::int64_t total = 0;
  double kl_sum = 0;
  for (const auto& b : r.buckets) total += b.count, kl_sum += b.kl * b.count;
  EXPECT_EQ(total, 64);
  EXPECT_NEAR(kl_sum / 64, r.summary.kl, 1e-15);
  // Default log2 edges 0,1,2,4,...,64,100: positions 36..63 and 64..99.
  ASSERT_EQ(r.bucket_edges.back(), 100);
  EXPECT_EQ(r.buckets[r.buckets.size() - 2].count, 28);
  EXPECT_EQ(r.buckets.back().count, 36);
  // Same rows as the full run at those positions.
  const AttentionReport full = measure(l);
  for (int i = 0; i < 64; ++i)
    EXPECT_NEAR(r.heads[0].positions.kl[i], full.heads[0].positions.kl[36 + i], 1e-12);
}

TEST(Attention, OutlierPatchingReducesKl) {
  Layer l = make_layer(2, 1, 128, 32, 0.0, 7);
  // Noise plus a few large errors (the outliers the patching should find first).
  l.kh[0] = add_noise(l.k[0], 0.05, 13);
  Rng rng(14);
  for (int i = 0; i < 40; ++i) {
    const int r = static_cast<int>(rng.uniform() * 128), c = static_cast<int>(rng.uniform() * 32);
    l.kh[0](r, c) += 3.0f;
  }
  AttentionOptions opts;
  opts.outlier_percents = {0.1, 1.0, 5.0, 100.0};
  const AttentionReport r = measure(l, opts);
  ASSERT_EQ(r.outliers.size(), 4u);
  EXPECT_EQ(r.outliers[0].patched_entries, 5);  // ceil(0.001 * 4096)
  EXPECT_EQ(r.outliers[2].patched_entries, 205);
  EXPECT_LT(r.outliers[0].kl, r.summary.kl);
  EXPECT_LT(r.outliers[1].kl, r.outliers[0].kl);
  EXPECT_LT(r.outliers[2].kl, r.outliers[1].kl);
  EXPECT_EQ(r.outliers[3].kl, 0.0);
  EXPECT_NEAR(r.outliers[3].k_err_share, 1.0, 1e-12);
  EXPECT_GT(r.outliers[1].k_err_share, 0.5);  // the 40 injected errors dominate ‖K − K̂‖²
}

TEST(Attention, MethodPathUsesTheCacheReconstruction) {
  const auto method = make_method("kvarn_k4v2_g128");
  const Layer l = make_layer(4, 2, 320, 64, 0.0, 8);
  AttentionOptions opts;
  opts.per_position = false;
  const AttentionReport r = attention_metrics(*method, l.q, l.k, l.v, {}, opts);
  EXPECT_GT(r.summary.kl, 0.0);
  EXPECT_TRUE(std::isfinite(r.summary.kl));
  EXPECT_TRUE(r.heads[0].positions.kl.empty());
  // Positions inside the fp16 sink (first 128 tokens) read exact-up-to-fp16 keys only, so their
  // error is far below the quantized region's.
  double early = 0, late = 0;
  std::int64_t ne = 0, nl = 0;
  for (std::size_t b = 0; b < r.buckets.size(); ++b) {
    if (r.bucket_edges[b + 1] <= 128)
      early += r.buckets[b].kl * r.buckets[b].count, ne += r.buckets[b].count;
    if (r.bucket_edges[b] >= 256)
      late += r.buckets[b].kl * r.buckets[b].count, nl += r.buckets[b].count;
  }
  ASSERT_GT(ne, 0);
  ASSERT_GT(nl, 0);
  EXPECT_LT(early / ne, 0.1 * late / nl);
  // Outlier patching only touches quantized tokens: 128 of 320 per KV head.
  EXPECT_EQ(r.outliers[2].patched_entries,
            2 * static_cast<std::int64_t>(std::ceil(0.05 * 128 * 64)));
  const nlohmann::json j = r;
  EXPECT_EQ(j["q_heads"], 4);
  EXPECT_FALSE(j["heads"][0].contains("positions"));
}

// The row formulas moved to kvarn/core/attention_row.hpp (shared with the GPU path). These are the
// formulas as they were before the move (std::max, std::clamp, a cached ln 2, an inline tie rule);
// the public primitives must still give exactly their bits.
namespace before_move {
double ln2() {
  static const double v = std::log1p(1.0);
  return v;
}
double softplus(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }
double lse(const std::vector<double>& s) {
  double mx = s[0];
  for (double x : s) mx = std::max(mx, x);
  double sum = 0;
  for (double x : s) sum += std::exp(x - mx);
  return mx + std::log(sum);
}
// {KL, JS} of one row.
std::pair<double, double> kl_js(const std::vector<double>& s, const std::vector<double>& sh) {
  const int n = static_cast<int>(s.size());
  const double l = lse(s), lh = lse(sh);
  std::vector<double> p(n), ph(n);
  double kl = 0, js = 0;
  for (int j = 0; j < n; ++j) {
    const double ls = s[j] - l, lsh = sh[j] - lh;
    p[j] = std::exp(ls);
    ph[j] = std::exp(lsh);
    kl += p[j] * (ls - lsh);
  }
  for (int j = 0; j < n; ++j) {
    const double dlt = (sh[j] - lh) - (s[j] - l);
    js += p[j] * (ln2() - softplus(dlt)) + ph[j] * (ln2() - softplus(-dlt));
  }
  return {std::max(0.0, kl), std::clamp(0.5 * js, 0.0, ln2())};
}
double topk(const std::vector<double>& s, const std::vector<double>& sh, int k) {
  const int n = static_cast<int>(s.size());
  if (n <= k) return 1.0;
  auto top = [k, n](const std::vector<double>& x) {
    std::vector<int> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(),
              [&x](int a, int b) { return x[a] != x[b] ? x[a] > x[b] : a < b; });
    idx.resize(k);
    return idx;
  };
  const std::vector<int> a = top(s), b = top(sh);
  int common = 0;
  for (int i = 0; i < k; ++i) common += std::find(b.begin(), b.end(), a[i]) != b.end() ? 1 : 0;
  return static_cast<double>(common) / k;
}
}  // namespace before_move

TEST(Attention, RowPrimitivesKeepTheirBitsAfterMovingToCore) {
  Rng rng(31);
  for (int trial = 0; trial < 240; ++trial) {
    const int n = 1 + (trial * 37) % 700;
    const double noise =
        trial % 4 == 0 ? 0.0 : (trial % 4 == 1 ? 1e-4 : (trial % 4 == 2 ? 0.3 : 6.0));
    std::vector<double> s(n), sh(n);
    for (int j = 0; j < n; ++j) {
      s[j] = 5.0 * rng.normal() + (trial % 7 == 0 ? 900.0 : 0.0);
      if (trial % 5 == 0) s[j] = std::round(s[j]);  // many exact ties for the top-k rule
      sh[j] = s[j] + noise * rng.normal();
      if (trial % 5 == 0) sh[j] = std::round(sh[j]);
    }
    const auto [kl, js] = before_move::kl_js(s, sh);
    ASSERT_EQ(kl_from_logits(s, sh), kl) << "trial " << trial;
    ASSERT_EQ(js_from_logits(s, sh), js) << "trial " << trial;
    for (int k : {1, 3, 8, 32})
      ASSERT_EQ(topk_overlap(s, sh, k), before_move::topk(s, sh, k))
          << "trial " << trial << " k " << k;
  }
}

}  // namespace
}  // namespace kvarn
