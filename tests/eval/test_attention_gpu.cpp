// AttentionDevice::kCuda must give the CPU reference's AttentionReport: every per-row metric within
// 1e-9 relative (absolute 1e-12 near 0, e.g. KL of nearly exact rows), top-k overlaps and all
// host-side fields (counts, patched entries, k_err_share) exactly. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "attention_test_util.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/data/tile_file.hpp"
#include "kvarn/eval/attention.hpp"
#include "test_util.hpp"

namespace kvarn {
namespace {

constexpr double kRel = 1e-9;
constexpr double kAbs = 1e-12;

#define KVARN_REQUIRE_CUDA_EVAL()                                                           \
  do {                                                                                      \
    if (!attention_cuda_built()) GTEST_SKIP() << "kvarn_eval was built without kvarn_cuda"; \
    if (attention_cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";                    \
  } while (0)

using Layer = testing::AttentionLayer;
using testing::make_attention_layer;

// Largest |gpu − cpu| / (|cpu| + kAbs / kRel) seen, for the log.
struct Worst {
  double ratio = 0;
  std::string where;
  void see(double c, double g, const std::string& w) {
    const double r = std::fabs(g - c) / (kRel * std::fabs(c) + kAbs);
    if (r > ratio) ratio = r, where = w;
  }
};

void expect_close(double c, double g, const std::string& what, Worst* worst) {
  worst->see(c, g, what);
  EXPECT_LE(std::fabs(g - c), kRel * std::fabs(c) + kAbs) << what << ": cpu " << c << " gpu " << g;
}

void expect_close(const std::vector<double>& c, const std::vector<double>& g,
                  const std::string& what, Worst* worst) {
  ASSERT_EQ(c.size(), g.size()) << what;
  for (std::size_t i = 0; i < c.size(); ++i) {
    worst->see(c[i], g[i], what);
    ASSERT_LE(std::fabs(g[i] - c[i]), kRel * std::fabs(c[i]) + kAbs)
        << what << "[" << i << "]: cpu " << c[i] << " gpu " << g[i];
  }
}

void expect_summary(const AttentionSummary& c, const AttentionSummary& g, const std::string& w,
                    Worst* worst) {
  EXPECT_EQ(c.count, g.count) << w;
  expect_close(c.logit_mae, g.logit_mae, w + ".logit_mae", worst);
  expect_close(c.logit_rmse, g.logit_rmse, w + ".logit_rmse", worst);
  expect_close(c.kl, g.kl, w + ".kl", worst);
  expect_close(c.kl_max, g.kl_max, w + ".kl_max", worst);
  expect_close(c.js, g.js, w + ".js", worst);
  expect_close(c.output_nmse, g.output_nmse, w + ".output_nmse", worst);
  expect_close(c.topk_overlap, g.topk_overlap, w + ".topk", worst);
}

// Returns the worst relative deviation (in units of the tolerance) for the log.
double expect_reports_match(const AttentionReport& c, const AttentionReport& g) {
  Worst worst;
  EXPECT_EQ(c.q_heads, g.q_heads);
  EXPECT_EQ(c.kv_heads, g.kv_heads);
  EXPECT_EQ(c.tokens, g.tokens);
  EXPECT_EQ(c.queries, g.queries);
  EXPECT_EQ(c.q_first, g.q_first);
  EXPECT_EQ(c.topk, g.topk);
  EXPECT_EQ(c.bucket_edges, g.bucket_edges);
  EXPECT_EQ(c.heads.size(), g.heads.size());
  for (std::size_t h = 0; h < std::min(c.heads.size(), g.heads.size()); ++h) {
    const std::string w = "head " + std::to_string(h);
    EXPECT_EQ(c.heads[h].kv_head, g.heads[h].kv_head);
    const PositionMetrics& pc = c.heads[h].positions;
    const PositionMetrics& pg = g.heads[h].positions;
    expect_close(pc.logit_mae, pg.logit_mae, w + " logit_mae", &worst);
    expect_close(pc.logit_rmse, pg.logit_rmse, w + " logit_rmse", &worst);
    expect_close(pc.kl, pg.kl, w + " kl", &worst);
    expect_close(pc.js, pg.js, w + " js", &worst);
    expect_close(pc.output_nmse, pg.output_nmse, w + " output_nmse", &worst);
    EXPECT_EQ(pc.topk_overlap, pg.topk_overlap) << w << " topk_overlap";  // exactly
    expect_summary(c.heads[h].summary, g.heads[h].summary, w, &worst);
    EXPECT_EQ(c.heads[h].buckets.size(), g.heads[h].buckets.size());
  }
  expect_summary(c.summary, g.summary, "summary", &worst);
  EXPECT_EQ(c.buckets.size(), g.buckets.size());
  for (std::size_t b = 0; b < std::min(c.buckets.size(), g.buckets.size()); ++b)
    expect_summary(c.buckets[b], g.buckets[b], "bucket " + std::to_string(b), &worst);
  EXPECT_EQ(c.outliers.size(), g.outliers.size());
  for (std::size_t i = 0; i < std::min(c.outliers.size(), g.outliers.size()); ++i) {
    EXPECT_EQ(c.outliers[i].patched_entries, g.outliers[i].patched_entries);
    EXPECT_EQ(c.outliers[i].k_err_share, g.outliers[i].k_err_share);  // host code, same bits
    expect_close(c.outliers[i].kl, g.outliers[i].kl, "outlier kl", &worst);
  }
  std::printf("[ gpu/cpu  ] worst deviation %.3g of the tolerance (%s)\n", worst.ratio,
              worst.where.c_str());
  return worst.ratio;
}

struct Timed {
  AttentionReport cpu, gpu;
  double cpu_s = 0, gpu_s = 0;
};

Timed run_both(const Layer& l, AttentionOptions opts) {
  using clock = std::chrono::steady_clock;
  Timed t;
  opts.device = AttentionDevice::kCpu;
  auto t0 = clock::now();
  t.cpu = attention_metrics(l.q, l.k, l.v, l.kh, l.vh, opts);
  auto t1 = clock::now();
  opts.device = AttentionDevice::kCuda;
  t.gpu = attention_metrics(l.q, l.k, l.v, l.kh, l.vh, opts);
  auto t2 = clock::now();
  t.cpu_s = std::chrono::duration<double>(t1 - t0).count();
  t.gpu_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf("[ timing   ] Hq %zu Hkv %zu T %ld Tq %ld D %ld: cpu %.3f s, gpu %.3f s\n",
              l.q.size(), l.k.size(), static_cast<long>(l.k[0].rows()),
              static_cast<long>(l.q[0].rows()), static_cast<long>(l.k[0].cols()), t.cpu_s, t.gpu_s);
  return t;
}

TEST(AttentionGpu, WithoutCudaTheDeviceIsAClearError) {
  if (attention_cuda_built() && attention_cuda_devices() > 0)
    GTEST_SKIP() << "a CUDA device is present (covered by the comparisons below)";
  const Layer l = make_attention_layer(2, 1, 32, 32, 16, 0.1, 1);
  AttentionOptions opts;
  opts.device = AttentionDevice::kCuda;
  try {
    attention_metrics(l.q, l.k, l.v, l.kh, l.vh, opts);
    ADD_FAILURE() << "expected kvarn::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("attention_metrics: device cuda requested"), std::string::npos) << msg;
  }
}

TEST(AttentionGpu, LongRowsGqa4To1AllPositions) {
  KVARN_REQUIRE_CUDA_EVAL();
  const Layer l = make_attention_layer(8, 2, 2100, 2100, 64, 0.05, 11);
  const Timed t = run_both(l, {});
  EXPECT_GT(t.cpu.summary.kl, 0.0);
  expect_reports_match(t.cpu, t.gpu);
}

TEST(AttentionGpu, LongRowsLastQueriesD128) {
  KVARN_REQUIRE_CUDA_EVAL();
  // Tq < T (queries of the last 256 tokens), GQA 4:1, D = 128, a heavier noise level.
  const Layer l = make_attention_layer(4, 1, 2304, 256, 128, 0.2, 12);
  const Timed t = run_both(l, {});
  expect_reports_match(t.cpu, t.gpu);
}

TEST(AttentionGpu, OneToOneExplicitQFirstAndOtherTopk) {
  KVARN_REQUIRE_CUDA_EVAL();
  Layer l = make_attention_layer(2, 2, 2050, 300, 64, 0.02, 13);
  AttentionOptions opts;
  opts.q_first = 1000;  // rows at positions 1000..1299 of 2050 tokens
  opts.topk = {1, 5, 100};
  opts.outlier_percents = {0.5, 100.0};
  opts.bucket_edges = {0, 1024, 1200, 2050};
  const Timed t = run_both(l, opts);
  EXPECT_EQ(t.gpu.q_first, 1000);
  expect_reports_match(t.cpu, t.gpu);
  EXPECT_EQ(t.gpu.outliers[1].kl, 0.0);  // every K entry patched: p̂ = p exactly
}

TEST(AttentionGpu, ExactReconstructionGivesExactZeros) {
  KVARN_REQUIRE_CUDA_EVAL();
  const Layer l = make_attention_layer(4, 2, 300, 300, 128, 0.0, 14);
  AttentionOptions opts;
  opts.device = AttentionDevice::kCuda;
  const AttentionReport r = attention_metrics(l.q, l.k, l.v, l.kh, l.vh, opts);
  EXPECT_EQ(r.summary.count, 4 * 300);
  EXPECT_EQ(r.summary.kl_max, 0.0);
  EXPECT_EQ(r.summary.js, 0.0);
  EXPECT_EQ(r.summary.logit_mae, 0.0);
  EXPECT_EQ(r.summary.output_nmse, 0.0);
  for (double o : r.summary.topk_overlap) EXPECT_EQ(o, 1.0);
}

TEST(AttentionGpu, DeterministicAcrossRuns) {
  KVARN_REQUIRE_CUDA_EVAL();
  const Layer l = make_attention_layer(4, 1, 700, 700, 64, 0.1, 15);
  AttentionOptions opts;
  opts.device = AttentionDevice::kCuda;
  const AttentionReport a = attention_metrics(l.q, l.k, l.v, l.kh, l.vh, opts);
  const AttentionReport b = attention_metrics(l.q, l.k, l.v, l.kh, l.vh, opts);
  EXPECT_EQ(nlohmann::json(a).dump(), nlohmann::json(b).dump());
}

// Real KV and queries of the fixture model (Qwen3, D 128, 480 tokens, q heads 0 and 2 of 4 over
// 2 KV heads), through the method path the sweep engine uses, per (sequence, layer, KV head).
TEST(AttentionGpu, RealCaptureFixtureHeldout) {
  KVARN_REQUIRE_CUDA_EVAL();
  const TileReader reader(std::string(KVARN_SOURCE_DIR) + "/data/tiles/fixture_heldout.h5");
  const int group = reader.info().num_q_heads / reader.info().num_kv_heads;
  int compared = 0;
  double worst = 0;
  for (const char* name : {"kvarn_k4v2_g128", "kivi_2bit", "turboquant_3bit_nc"}) {
    const auto method = make_method(name);
    for (int s = 0; s < reader.num_sequences(); ++s) {
      const SequenceInfo& si = reader.sequence(s);
      ASSERT_TRUE(si.has_q);
      for (int li = 0; li < reader.info().num_captured_layers(); ++li) {
        for (int g = 0; g < reader.info().num_kv_heads; ++g) {
          std::vector<Matrix> q;
          for (std::size_t qi = 0; qi < si.q_heads.size(); ++qi)
            if (si.q_heads[qi] / group == g)
              q.push_back(reader.read(s, "q", li, static_cast<int>(qi)));
          if (q.empty()) continue;
          const std::vector<Matrix> k = {reader.read(s, "k", li, g)};
          const std::vector<Matrix> v = {reader.read(s, "v", li, g)};
          const std::vector<SequenceResult> qz = {quantize_sequence(*method, k[0], v[0])};
          AttentionOptions opts;
          const AttentionReport c = attention_metrics(q, k, v, qz, opts);
          opts.device = AttentionDevice::kCuda;
          const AttentionReport gr = attention_metrics(q, k, v, qz, opts);
          SCOPED_TRACE(std::string(name) + " seq " + std::to_string(s) + " layer " +
                       std::to_string(li) + " kv " + std::to_string(g));
          EXPECT_GT(c.summary.kl, 0.0);
          worst = std::max(worst, expect_reports_match(c, gr));
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 3 * 2 * 4 * 2);
  std::printf("[ gpu/cpu  ] real capture: %d reports, worst deviation %.3g of the tolerance\n",
              compared, worst);
}

}  // namespace
}  // namespace kvarn
