#include <gtest/gtest.h>

#include <cmath>

#include "test_util.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"
#include "kvarn/eval/tile_metrics.hpp"

namespace kvarn {
namespace {

using testing::random_kv;

const KvarnMethod& as_kvarn(const Method& m) { return dynamic_cast<const KvarnMethod&>(m); }

TEST(TileMetrics, KvarnStagesOnOutlierData) {
  const auto method = make_method("kvarn_k4v2_g128");
  const Matrix k = random_kv(384, 128, 21, true);
  const Matrix v = random_kv(384, 128, 22, false);
  const KvarnStageReport st = kvarn_stage_metrics(as_kvarn(*method), k, v);
  EXPECT_EQ(st.first_token, 128);  // the sink tile stays fp16
  EXPECT_EQ(st.tiles, 2);
  for (const KvarnStreamStageMetrics* s : {&st.key, &st.value}) {
    // Rotation only adds fp16 rounding (relative 2^-11 at most per entry).
    EXPECT_GT(s->rotation.nmse, 0.0);
    EXPECT_LT(s->rotation.nmse, 1e-6);
    EXPECT_EQ(s->rotation.rows, 256);
    // Quantization error dominates; measured in either domain it is a real error.
    EXPECT_GT(s->quant_normalized.nmse, 100 * s->rotation.nmse);
    EXPECT_GT(s->quant_rotated.nmse, 100 * s->rotation.nmse);
    EXPECT_GT(s->end_to_end.nmse, 100 * s->rotation.nmse);
    // The rotation is orthogonal: end to end differs from the rotated-domain error only by the
    // fp16 rounding of the rotated input.
    EXPECT_NEAR(s->end_to_end.nmse, s->quant_rotated.nmse, 0.05 * s->quant_rotated.nmse);
    // VarN keeps the best imbalance seen, identity included.
    EXPECT_LE(s->imbalance_normalized, s->imbalance_rotated);
    EXPECT_GT(s->imbalance_raw, 0.0);
  }
  // 4-bit keys beat 2-bit values.
  EXPECT_LT(st.key.quant_normalized.nmse, st.value.quant_normalized.nmse);
}

TEST(TileMetrics, StageEndToEndEqualsQuantizeSequence) {
  const auto method = make_method("kvarn_k4v2_g128");
  const Matrix k = random_kv(256, 128, 23, true);
  const Matrix v = random_kv(256, 128, 24, true);
  const MethodTileReport r = method_metrics(*method, k, v);
  ASSERT_TRUE(r.stages.has_value());
  EXPECT_EQ(r.stages->tiles, 1);
  EXPECT_EQ(r.key.quantized_tokens, 128);
  // Same tile, same bytes: the stage driver's end to end is quantize_sequence's exactly.
  EXPECT_DOUBLE_EQ(r.stages->key.end_to_end.nmse, r.key.quantized_only.nmse);
  EXPECT_DOUBLE_EQ(r.stages->value.end_to_end.nmse, r.value.quantized_only.nmse);
  EXPECT_DOUBLE_EQ(r.stages->key.end_to_end.p99_abs, r.key.quantized_only.p99_abs);
  EXPECT_EQ(r.stages->key.end_to_end.nmse_per_channel, r.key.quantized_only.nmse_per_channel);
  // Also directly on the second tile with the config (explicit first token / tile count).
  const KvarnStageReport direct = kvarn_stage_metrics(as_kvarn(*method).config(), k, v, 128, 1);
  EXPECT_DOUBLE_EQ(direct.key.end_to_end.nmse, r.key.quantized_only.nmse);
}

TEST(TileMetrics, AllTokensVersusQuantizedOnly) {
  const auto method = make_method("kvarn_k4v2_g128");
  const Matrix k = random_kv(300, 64, 25, true);
  const Matrix v = random_kv(300, 64, 26, false);
  const MethodTileReport r = method_metrics(*method, k, v);
  // Sink 0..127 and tail 256..299 stay fp16; tokens 128..255 are quantized.
  EXPECT_EQ(r.key.quantized_tokens, 128);
  EXPECT_EQ(r.key.all_tokens.rows, 300);
  EXPECT_EQ(r.key.quantized_only.rows, 128);
  EXPECT_LT(r.key.all_tokens.nmse, r.key.quantized_only.nmse);
  EXPECT_LT(r.value.all_tokens.nmse, r.value.quantized_only.nmse);
  ASSERT_EQ(r.key.all_tokens.nmse_per_token.size(), 300u);
  EXPECT_LT(r.key.all_tokens.nmse_per_token[10], 1e-5);  // sink token: fp16 round trip only
  const nlohmann::json j = r;
  EXPECT_EQ(j["method"], "kvarn_k4v2_g128");
  EXPECT_TRUE(j.contains("stages"));
  EXPECT_EQ(j["key"]["quantized_only"]["rows"], 128);
  EXPECT_EQ(j.dump().find("nan"), std::string::npos);
  EXPECT_EQ(j.dump().find("null"), std::string::npos);
}

TEST(TileMetrics, EveryRegistryPresetRunsEndToEnd) {
  const Matrix k = random_kv(256, 128, 27, true);
  const Matrix v = random_kv(256, 128, 28, false);
  for (const PresetInfo& p : Registry::instance().presets()) {
    SCOPED_TRACE(p.name);
    const auto method = make_method(p.name);
    const MethodTileReport r = method_metrics(*method, k, v);
    EXPECT_EQ(r.stages.has_value(), method->family() == "kvarn");
    EXPECT_TRUE(std::isfinite(r.key.all_tokens.nmse));
    EXPECT_TRUE(std::isfinite(r.value.all_tokens.nmse));
    EXPECT_LE(r.key.quantized_tokens, 256);
    if (r.key.quantized_tokens > 0) {
      EXPECT_EQ(r.key.quantized_only.rows, r.key.quantized_tokens);
    }
  }
}

TEST(TileMetrics, RejectsTilesOutsideTheSequence) {
  const auto method = make_method("kvarn_k4v2_g128");
  const Matrix k = random_kv(200, 128, 29, true);
  EXPECT_THROW(kvarn_stage_metrics(as_kvarn(*method).config(), k, k, 128, 1), Error);
  // Shorter than sink + one group: no tile to measure, no error.
  const KvarnStageReport r = kvarn_stage_metrics(as_kvarn(*method), k, k);
  EXPECT_EQ(r.tiles, 0);
  EXPECT_EQ(r.key.end_to_end.rows, 0);
}

}  // namespace
}  // namespace kvarn
