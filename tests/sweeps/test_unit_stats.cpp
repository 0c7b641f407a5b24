// Summary-row statistics against closed forms: position buckets of attention rows in the engine's
// output (KVarN's sink, tile and tail), of pseudo-decode blocks and decode steps (sink, tiles,
// quantize-on-arrival, TurboQuant's fp16 boundary layers, both current-token policies), planted
// bucket sums, and the unit CIs the rows carry.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "kvarn/core/registry.hpp"
#include "kvarn/eval/bootstrap.hpp"
#include "kvarn/sweeps/config.hpp"
#include "kvarn/sweeps/engine.hpp"
#include "kvarn/sweeps/store.hpp"
#include "kvarn/sweeps/unit_stats.hpp"
#include "sweep_test_util.hpp"

namespace kvarn {
namespace {

using nlohmann::json;
using testing_util::TempDirTest;

const std::vector<int> kBlocks512 = {64, 128, 192, 256, 320, 384, 448, 512};

TEST(BlockDistances, KvarnSinkAndTiles) {
  // Sink 128, tiles of 128 flushed when complete. Exact: block at `start` reads the cache of
  // `start` tokens, quantized [128, 128 * floor(start / 128)); its first row is `start`.
  const auto m = make_method("kvarn_k4v2_g128");
  const auto exact = block_distances(*m, 128, 2, kBlocks512, false, false);
  const std::vector<int> want = {-1, -1, -1, -1, 1, 65, 1, 65};
  for (std::size_t j = 0; j < want.size(); ++j) {
    EXPECT_EQ(exact[j][0], want[j]) << j;
    EXPECT_EQ(exact[j][1], want[j]) << j;
  }
  // Quantized: the block is written first (cache of `end` tokens): the block ending at 256
  // completes tile [128, 256), so its first row (192) reads it at distance 0.
  const auto quant = block_distances(*m, 128, 1, kBlocks512, true, false);
  const std::vector<int> want_q = {-1, -1, -1, 0, 1, 0, 1, 0};
  for (std::size_t j = 0; j < want_q.size(); ++j) EXPECT_EQ(quant[j][0], want_q[j]) << j;
  // Static: the final cache of 512 holds [128, 512) quantized; rows before `start` plus the
  // block's first row exact: 1 from block 192 on (row 191 is quantized in the final cache).
  const auto stat = block_distances(*m, 128, 1, kBlocks512, false, true);
  const std::vector<int> want_s = {-1, -1, -1, 1, 1, 1, 1, 1};
  for (std::size_t j = 0; j < want_s.size(); ++j) EXPECT_EQ(stat[j][0], want_s[j]) << j;
}

TEST(BlockDistances, QuantizeOnArrivalAndBoundaryLayers) {
  const auto fp8 = make_method("fp8_e4m3");
  const auto e = block_distances(*fp8, 128, 1, kBlocks512, false, false);
  const auto q = block_distances(*fp8, 128, 1, kBlocks512, true, false);
  EXPECT_EQ(e[0][0], -1);  // block 0 reads no cache
  EXPECT_EQ(q[0][0], 0);   // ... unless it reads itself back as stored
  for (std::size_t j = 1; j < kBlocks512.size(); ++j) {
    EXPECT_EQ(e[j][0], 1) << j;
    EXPECT_EQ(q[j][0], 0) << j;
  }
  // TurboQuant (vLLM's boundary rule, 2 layers each end) on 8 layers: layers 0, 1, 6, 7 fp16.
  const auto tq = make_method("turboquant_3bit_nc");
  const auto d = block_distances(*tq, 128, 8, kBlocks512, false, false);
  for (std::size_t j = 1; j < kBlocks512.size(); ++j) {
    for (int l = 0; l < 8; ++l) EXPECT_EQ(d[j][l], (l >= 2 && l <= 5) ? 1 : -1) << j << " " << l;
  }
  const auto fp16 = make_method("fp16");
  for (const auto& row : block_distances(*fp16, 128, 2, kBlocks512, true, true))
    for (int x : row) EXPECT_EQ(x, -1);
}

TEST(DecodeStepDistances, ExactAndQuantized) {
  // Context 512, last block [448, 512): step 0 is row 511 reading the cache of 448 tokens.
  const auto fp8 = make_method("fp8_e4m3");
  EXPECT_EQ(decode_step_distances(*fp8, 128, 2, 512, 448, 4, false),
            (std::vector<int>{64, 1, 1, 1}));
  EXPECT_EQ(decode_step_distances(*fp8, 128, 2, 512, 448, 4, true), (std::vector<int>{0, 0, 0, 0}));
  // KVarN: the cache after 512 tokens holds [128, 512); steps at 512, 513, ... read it at
  // distance 1, 2, ... (the new tokens sit in the fp16 tail). Step 0 reads the cache of 448
  // tokens: quantized [128, 384), row 511 at distance 128.
  const auto kv = make_method("kvarn_k4v2_g128");
  EXPECT_EQ(decode_step_distances(*kv, 128, 1, 512, 448, 4, false),
            (std::vector<int>{128, 1, 2, 3}));
  EXPECT_EQ(decode_step_distances(*kv, 128, 1, 512, 448, 3, true), (std::vector<int>{0, 1, 2}));
  // The nearest over layers: TurboQuant's quantized layers count, its fp16 boundary layers not.
  const auto tq = make_method("turboquant_3bit_nc");
  EXPECT_EQ(decode_step_distances(*tq, 128, 8, 512, 448, 2, false), (std::vector<int>{64, 1}));
  const auto fp16 = make_method("fp16");
  EXPECT_EQ(decode_step_distances(*fp16, 128, 4, 512, 448, 2, true), (std::vector<int>{-1, -1}));
}

TEST(AttentionBuckets, PlantedRows) {
  // One head, 6 query rows at positions 2..7 of an 8-token cache; kl = position, other metrics 1.
  AttentionReport rep;
  rep.q_heads = rep.kv_heads = 1;
  rep.tokens = 8;
  rep.queries = 6;
  rep.q_first = 2;
  rep.topk = {1};
  HeadAttentionMetrics h;
  for (int i = 0; i < 6; ++i) {
    h.positions.kl.push_back(2.0 + i);
    for (auto* v : {&h.positions.js, &h.positions.logit_mae, &h.positions.logit_rmse,
                    &h.positions.output_nmse})
      v->push_back(1.0);
  }
  h.positions.topk_overlap = {std::vector<double>(6, 0.5)};
  rep.heads = {h};
  // Positions 0..3 read no quantized token, 4 is one (d0), 5..7 at d = 1, 2, 3.
  const std::vector<int> dist = {-1, -1, -1, -1, 0, 1, 2, 3};
  AttentionBuckets b;
  UnitStats units;
  b.add(rep, dist, "u0", &units);
  rep.heads[0].positions.kl.assign(6, 10.0);
  b.add(rep, dist, "u1", &units);
  std::map<std::string, double> m;
  for (const auto& [k, v] : b.metrics()) m[k] = v;
  EXPECT_DOUBLE_EQ(m.at("headline.rows"), 8);  // positions 4..7, twice
  EXPECT_DOUBLE_EQ(m.at("headline.kl.mean"), (4 + 5 + 6 + 7 + 40) / 8.0);
  EXPECT_DOUBLE_EQ(m.at("bucket.fp16_only.rows"), 4);
  EXPECT_DOUBLE_EQ(m.at("bucket.fp16_only.kl.mean"), (2 + 3 + 20) / 4.0);
  EXPECT_DOUBLE_EQ(m.at("bucket.d0.kl.mean"), (4 + 10) / 2.0);
  EXPECT_DOUBLE_EQ(m.at("bucket.d1-15.rows"), 6);
  EXPECT_DOUBLE_EQ(m.at("headline.topk_overlap.1"), 0.5);
  EXPECT_EQ(m.count("bucket.d16-127.rows"), 0u);  // empty buckets are left out
  // Units: the all-rows and headline sums of each add(); the ratio CI brackets the pooled mean.
  const json uv = units.unit_values();
  EXPECT_DOUBLE_EQ(uv["attention.headline.kl.mean"]["u0"].get<double>(), 5.5);
  EXPECT_DOUBLE_EQ(uv["attention.kl.mean"]["u1"].get<double>(), 10.0);
  const auto ci = units.ci("attention.kl.mean", row_bootstrap_options(3));
  ASSERT_TRUE(ci.has_value());
  EXPECT_DOUBLE_EQ(ci->estimate, (27 + 60) / 12.0);
  EXPECT_EQ(ci->samples, 2);
  EXPECT_EQ(ci->seed, 3u);
  EXPECT_FALSE(units.ci("attention.kl.max", row_bootstrap_options(3)).has_value());
}

TEST(UnitStats, EqualUnitsGiveTheMeanCi) {
  UnitStats u;
  const std::vector<double> x = {0.3, 0.1, 0.4, 0.1, 0.5, 0.9, 0.2, 0.6};
  const char* ids[] = {"a", "b", "c", "d", "e", "f", "g", "h"};
  for (std::size_t i = 0; i < x.size(); ++i) u.add("m", ids[i], x[i], 1.0);
  const BootstrapOptions o = row_bootstrap_options(7);
  const BootstrapCi want = bootstrap_mean_ci(x, o);
  const auto got = u.ci("m", o);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->lo, want.lo);
  EXPECT_EQ(got->hi, want.hi);
  u.add("one", "u0", 1.0, 1.0);
  EXPECT_FALSE(u.ci("one", o).has_value());  // a single unit has no interval
}

class UnitRowsTest : public TempDirTest {};

TEST_F(UnitRowsTest, EngineRowsCarryBucketsAndCis) {
  // Sequence 0 (300 tokens) of sample.h5, 2 layers, 2 captured query heads. KVarN g128: sink
  // [0, 128), tile [128, 256), fp16 tail [256, 300): rows 0-127 read only fp16 tokens, 128-255 at
  // distance 0, 256-270 at 1-15, 271-299 at 16-44. Per (layer, query head): 128 / 128 / 15 / 29.
  const SweepConfig cfg = load_config(small_config("  - kvarn_k4v2_g128\n"), {"data.max_tokens=0"});
  SweepOptions o;
  o.report = false;
  o.log = std::fopen("/dev/null", "w");
  o.progress_tty = 0;
  o.command = "test";
  const SweepResult r = run_sweep(cfg, o);
  std::fclose(o.log);
  const json rec = read_json_file(RunStore(r.run_dir).case_path(cfg.cases[0].id));
  std::map<std::string, json> all;
  for (const json& row : rec["rows"])
    if (row["layer"] == "all") all[row["metric"].get<std::string>()] = row;
  auto value = [&](const char* k) { return all.at(k)["value"].get<double>(); };
  EXPECT_EQ(value("attention.bucket.fp16_only.rows"), 4 * 128);
  EXPECT_EQ(value("attention.bucket.d0.rows"), 4 * 128);
  EXPECT_EQ(value("attention.bucket.d1-15.rows"), 4 * 15);
  EXPECT_EQ(value("attention.bucket.d16-127.rows"), 4 * 29);
  EXPECT_EQ(all.count("attention.bucket.d128+.rows"), 0u);
  EXPECT_EQ(value("attention.headline.rows"), 4 * 172);
  // The sink rows read fp16 copies of the tokens (fp16 rounding only): far below the headline,
  // which the all-rows mean dilutes by the row-weighted mix.
  const double head = value("attention.headline.kl.mean");
  const double sink = value("attention.bucket.fp16_only.kl.mean");
  EXPECT_GT(head, 0.0);
  EXPECT_LT(sink, 1e-3 * head);
  EXPECT_NEAR(value("attention.kl.mean"), (head * 172.0 + sink * 128.0) / 300.0, 1e-12 * head);
  // CIs over the 4 (sequence, layer, KV head) units, bracketing the pooled value.
  for (const char* k : {"attention.kl.mean", "attention.headline.kl.mean", "key.end_to_end.nmse",
                        "value.end_to_end.nmse"}) {
    const json& row = all.at(k);
    ASSERT_TRUE(row.contains("ci_lo")) << k;
    EXPECT_EQ(row["ci_units"], 4) << k;
    EXPECT_LE(row["ci_lo"].get<double>(), row["value"].get<double>() * (1 + 1e-12)) << k;
    EXPECT_GE(row["ci_hi"].get<double>(), row["value"].get<double>() * (1 - 1e-12)) << k;
  }
  // The magnitude shares (overall and of the top 0.1 / 1 / 5 % rows) carry CIs too. Every unit
  // holds 300 rows, so a top-rows row (row-weighted over units) is the plain mean of the units'
  // values; the overall share (error-weighted) lies within their range.
  for (const char* s : {"key", "value"}) {
    for (const char* m :
         {".end_to_end.magnitude_share", ".end_to_end.magnitude_share_top.0.1pct",
          ".end_to_end.magnitude_share_top.1pct", ".end_to_end.magnitude_share_top.5pct"}) {
      const std::string k = std::string(s) + m;
      const json& row = all.at(k);
      ASSERT_TRUE(row.contains("ci_lo")) << k;
      EXPECT_EQ(row["ci_units"], 4) << k;
      const double v = row["value"].get<double>();
      EXPECT_LE(row["ci_lo"].get<double>(), v * (1 + 1e-12)) << k;
      EXPECT_GE(row["ci_hi"].get<double>(), v * (1 - 1e-12)) << k;
      const json& units = rec["units"]["sample"][k];
      ASSERT_EQ(units.size(), 4u) << k;
      double sum = 0, lo = 1, hi = 0;
      for (const auto& [u, x] : units.items()) {
        sum += x.get<double>();
        lo = std::min(lo, x.get<double>());
        hi = std::max(hi, x.get<double>());
      }
      EXPECT_GT(hi, 0.0) << k;  // real tiles: a nonzero magnitude error
      if (k.find("_top.") != std::string::npos) {
        EXPECT_NEAR(v, sum / 4.0, 1e-12) << k;
      } else {
        EXPECT_GE(v, lo * (1 - 1e-12)) << k;
        EXPECT_LE(v, hi * (1 + 1e-12)) << k;
      }
    }
  }
  EXPECT_FALSE(all.at("attention.kl.max").contains("ci_lo"));
  EXPECT_EQ(rec["units"]["sample"]["attention.headline.kl.mean"].size(), 4u);
  EXPECT_EQ(rec["bootstrap"]["seed"], cfg.seed);
}

}  // namespace
}  // namespace kvarn
