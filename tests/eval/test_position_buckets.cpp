// Position buckets: which attention rows read a quantized token, and how far back, from the
// method's stream policies alone.
#include <gtest/gtest.h>

#include <cmath>

#include "kvarn/core/kvarn.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/eval/position_buckets.hpp"
#include "test_util.hpp"

namespace kvarn {
namespace {

TEST(PositionBuckets, KvarnSinkAndFirstTile) {
  auto m = make_method("kvarn_k4v2_g128");
  // Below sink + one tile (256 tokens) no token is quantized: every row reads fp16 only.
  for (int t : {1, 128, 200, 255}) {
    for (int d : row_distances(*m, 64, t)) ASSERT_EQ(d, kReadsNoQuantizedToken) << "T=" << t;
  }
  // T = 256: the first 128 rows are the sink, rows 128..255 read their own quantized token.
  const std::vector<int> at256 = row_distances(*m, 64, 256);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(at256[i], i < 128 ? -1 : 0) << i;
  // T = 768: 128 of 768 rows (16.7 %) read no quantized token.
  const std::vector<int> at768 = row_distances(*m, 64, 768);
  EXPECT_EQ(std::count(at768.begin(), at768.end(), -1), 128);
  EXPECT_EQ(std::count(at768.begin(), at768.end(), 0), 640);
  // T = 300: the tail 256..299 is fp16; its rows are i - 255 tokens past the newest tile.
  const std::vector<int> at300 = row_distances(*m, 64, 300);
  EXPECT_EQ(at300[255], 0);
  EXPECT_EQ(at300[256], 1);
  EXPECT_EQ(at300[299], 44);
}

TEST(PositionBuckets, TrailingWindowAndKiviWindows) {
  // Paper preset (sink 128, newest 128 fp16, tiles of 128) at T = 700: tiles [128, 512).
  auto p = make_method(kKvarnPaperPreset);
  const std::vector<int> d = row_distances(*p, 128, 700);
  EXPECT_EQ(d[127], -1);
  EXPECT_EQ(d[128], 0);
  EXPECT_EQ(d[511], 0);
  EXPECT_EQ(d[512], 1);
  EXPECT_EQ(d[699], 188);
  // kivi_2bit at T = 300: keys quantized [0, 256) (flushed 128 at a time), values [0, 172)
  // (behind the 128-token window); the nearest quantized token is the newest of either.
  auto k = make_method("kivi_2bit");
  const QuantizedSpans s = quantized_spans(*k, 128, 300);
  EXPECT_EQ(s.key_begin, 0);
  EXPECT_EQ(s.key_end, 256);
  EXPECT_EQ(s.value_end, 172);
  const std::vector<int> kd = row_distances(*k, 128, 300);
  EXPECT_EQ(kd[0], 0);
  EXPECT_EQ(kd[255], 0);
  EXPECT_EQ(kd[256], 1);
  EXPECT_EQ(kd[299], 44);
  // KIVI below both windows: nothing quantized.
  for (int x : row_distances(*k, 128, 127)) ASSERT_EQ(x, -1);
}

TEST(PositionBuckets, Fp16StreamsAndBoundaryLayers) {
  for (int x : row_distances(*make_method("fp16"), 64, 50)) ASSERT_EQ(x, -1);
  auto tq = make_method("turboquant_3bit_nc");
  for (int x : row_distances(*tq, 128, 50, {0, 8})) ASSERT_EQ(x, -1);  // boundary layer: fp16
  for (int x : row_distances(*tq, 128, 50, {3, 8})) ASSERT_EQ(x, 0);   // every token quantized
}

TEST(PositionBuckets, ModelLoopCacheState) {
  // Block of 32 queries at positions 256..287 under KVarN g128: with the current token exact the
  // block reads the cache as of 256 tokens (one tile quantized, [128, 256)); with the current
  // token quantized, as of 288 tokens (the same tile; the block itself is still the fp16 tail).
  auto m = make_method("kvarn_k4v2_g128");
  const QuantizedSpans exact = quantized_spans(*m, 64, 256);
  const QuantizedSpans cached = quantized_spans(*m, 64, 288);
  EXPECT_EQ(quantized_distance(exact, 256), 1);
  EXPECT_EQ(quantized_distance(cached, 287), 32);
  // FP8 quantizes on arrival: a block's own tokens are quantized only when read back (policy
  // "quantized"); with "exact" the newest quantized token is the one before the block.
  auto f = make_method("fp8_e4m3");
  EXPECT_EQ(quantized_distance(quantized_spans(*f, 64, 256), 260), 5);
  EXPECT_EQ(quantized_distance(quantized_spans(*f, 64, 288), 260), 0);
  EXPECT_EQ(quantized_distance(quantized_spans(*f, 64, 0), 0), -1);
}

TEST(PositionBuckets, SchemeLabelsAndBoundaries) {
  const BucketScheme s;
  EXPECT_EQ(s.count(), 5);
  EXPECT_EQ(s.bucket(-1), 0);
  EXPECT_EQ(s.bucket(0), 1);
  EXPECT_EQ(s.bucket(1), 2);
  EXPECT_EQ(s.bucket(15), 2);
  EXPECT_EQ(s.bucket(16), 3);
  EXPECT_EQ(s.bucket(127), 3);
  EXPECT_EQ(s.bucket(128), 4);
  EXPECT_EQ(s.bucket(100000), 4);
  EXPECT_EQ(s.label(0), "fp16_only");
  EXPECT_EQ(s.label(1), "d0");
  EXPECT_EQ(s.label(2), "d1-15");
  EXPECT_EQ(s.label(3), "d16-127");
  EXPECT_EQ(s.label(4), "d128+");
  EXPECT_THROW(s.label(5), Error);
}

TEST(PositionBuckets, SummaryHeadlineExcludesFp16OnlyRows) {
  // Rows: 2 fp16-only (value 0), 3 at distance 0 (value 1, 2, 3), 1 at distance 20 (value 10),
  // one NaN (left out).
  const std::vector<double> v = {0, 0, 1, 2, 3, 10, std::nan("")};
  const std::vector<int> d = {-1, -1, 0, 0, 0, 20, 0};
  const BucketSummary s = summarize_by_bucket(v, d);
  EXPECT_EQ(s.labels.size(), 5u);
  EXPECT_EQ(s.rows[0], 2);
  EXPECT_EQ(s.rows[1], 3);
  EXPECT_EQ(s.rows[3], 1);
  EXPECT_DOUBLE_EQ(s.mean[0], 0.0);
  EXPECT_DOUBLE_EQ(s.mean[1], 2.0);
  EXPECT_TRUE(std::isnan(s.mean[2]));
  EXPECT_DOUBLE_EQ(s.headline, 16.0 / 4);
  EXPECT_EQ(s.headline_rows, 4);
  EXPECT_DOUBLE_EQ(s.all_rows, 16.0 / 6);
  EXPECT_EQ(s.total_rows, 6);
  EXPECT_THROW(summarize_by_bucket({1.0}, {0, 1}), Error);
  BucketScheme bad;
  bad.edges = {1, 16};
  EXPECT_THROW(summarize_by_bucket({1.0}, {0}, bad), Error);
}

}  // namespace
}  // namespace kvarn
