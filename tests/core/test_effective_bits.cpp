// Effective bits: closed forms at known lengths for every way a method keeps tokens or layers in
// fp16 (sink, tail, trailing/residual windows, boundary layers).
#include <gtest/gtest.h>

#include "kvarn/core/effective_bits.hpp"
#include "kvarn/core/kvarn.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/data/error.hpp"
#include "test_util.hpp"

namespace kvarn {
namespace {

TEST(EffectiveBits, KvarnSinkAtT768D64) {
  // KVarN k4v2 g128, D=64, T=768 (hand count):
  //   record: K codes 64*128*4/8 = 4096, s_col_K 128, zp_K 128, s_row_K 256 (-> 4608);
  //           V codes 128*64*2/8 = 2048, s_col_V 128, s_row_V 256, zp_V 256 (-> 7296, 8-aligned)
  //   sink 128 tokens fp16: 128 * 2 * 64 * 2 B = 32768 B; the other 640 tokens = 5 whole tiles
  //   (no tail): 5 * 7296 = 36480 B. Total 69248 B over 768 * 2 * 64 elements:
  //   69248 * 8 / 98304 = 5.6354 bits/element, against 7296 * 8 / (128 * 128) = 3.5625 steady.
  auto m = make_method("kvarn_k4v2_g128");
  EXPECT_EQ(m->sequence_bytes(768, 64), 69248u);
  EXPECT_DOUBLE_EQ(effective_bits(*m, 64, 768), 69248.0 * 8 / (768 * 2 * 64));
  EXPECT_NEAR(effective_bits(*m, 64, 768), 5.64, 0.005);
  EXPECT_DOUBLE_EQ(m->accounting(64).bits_per_element(), 3.5625);
  // Below one sink + one tile nothing is quantized: exactly 16 bits.
  for (int t : {1, 128, 255}) EXPECT_DOUBLE_EQ(effective_bits(*m, 64, t), 16.0) << t;
  // T = 300: sink 128 + one tile (7296 B) + 44 tail tokens.
  EXPECT_DOUBLE_EQ(effective_bits(*m, 64, 300),
                   (128 * 256.0 + 7296 + 44 * 256.0) * 8 / (300 * 128.0));
}

TEST(EffectiveBits, KvarnAtT2048D128AndPaperWindow) {
  // k4v2 D=128: sink 128 * 512 B + 15 tiles * 13824 B = 272896 B over 2048 * 256 elements.
  auto m = make_method("kvarn_k4v2_g128");
  EXPECT_DOUBLE_EQ(effective_bits(*m, 128, 2048), 272896.0 * 8 / (2048 * 256));  // 4.1641
  // Paper 2/2 (fp8 scales, sink 128, newest 128 fp16): record 9216 B; T=2048 leaves
  // 2048 - 128 - 128 = 1792 = 14 whole tiles quantized, 256 tokens fp16:
  // (14 * 9216 + 256 * 512) * 8 / (2048 * 256) = 3.96875.
  auto p = make_method(kKvarnPaperPreset);
  EXPECT_DOUBLE_EQ(effective_bits(*p, 128, 2048), 3.96875);
  // T = 2047: the 14th tile still holds a token of the newest 128 -> 13 tiles, 2047 - 13 * 128 =
  // 383 tokens fp16.
  EXPECT_DOUBLE_EQ(effective_bits(*p, 128, 2047), (13 * 9216.0 + 383 * 512) * 8 / (2047 * 256));
}

TEST(EffectiveBits, KiviResidualWindows) {
  // kivi_2bit D=128 T=300: keys flushed 128 at a time (2 chunks of 6144 B, 44 fp16 keys of 256 B),
  // values behind a window of 128: 172 quantized (48 B) + 128 fp16 (256 B).
  auto m = make_method("kivi_2bit");
  const double bytes = 2 * 6144.0 + 44 * 256 + 172 * 48 + 128 * 256;  // 64576
  EXPECT_DOUBLE_EQ(effective_bits(*m, 128, 300), bytes * 8 / (300 * 256));
  // kivi_k4v2 D=64 T=768: 6 key chunks of 5120 B (40 B/token), 640 values of 24 B, 128 fp16
  // values of 128 B: 62464 B -> 5.0833 bits/element, against 4.0 steady.
  auto a = make_method("kivi_k4v2");
  EXPECT_DOUBLE_EQ(effective_bits(*a, 64, 768), 62464.0 * 8 / (768 * 128));
  EXPECT_DOUBLE_EQ(a->accounting(64).bits_per_element(), 4.0);
}

TEST(EffectiveBits, BoundaryLayersAtModelLevel) {
  // turboquant_3bit_nc on 8 layers: layers 0, 1, 6, 7 fp16 (16 bits), the rest 102 B/token at
  // D=128 (3.1875 bits): (4 * 16 + 4 * 3.1875) / 8 = 9.59375 at any length.
  auto m = make_method("turboquant_3bit_nc");
  for (int t : {1, 100, 768}) {
    EXPECT_DOUBLE_EQ(model_effective_bits(*m, 128, t, 8), 9.59375) << t;
    EXPECT_DOUBLE_EQ(effective_bits(*m, 128, t, {3, 8}), 3.1875);
    EXPECT_DOUBLE_EQ(effective_bits(*m, 128, t, {0, 8}), 16.0);
  }
  // 30 layers: 4 of 30 fp16.
  EXPECT_DOUBLE_EQ(model_effective_bits(*m, 128, 64, 30), (4 * 16 + 26 * 3.1875) / 30);
  // boundary=0: every layer quantized; one layer: nothing to skip.
  auto b0 = make_method("turboquant:k=3,v=3,nc=1,boundary=0");
  EXPECT_DOUBLE_EQ(model_effective_bits(*b0, 128, 64, 8), 3.1875);
  EXPECT_DOUBLE_EQ(model_effective_bits(*m, 128, 64, 1), 3.1875);
  // Methods without boundary layers: model level equals layer level.
  auto k = make_method("kvarn_k4v2_g128");
  EXPECT_DOUBLE_EQ(model_effective_bits(*k, 64, 768, 6), effective_bits(*k, 64, 768));
}

TEST(EffectiveBits, ApproachesSteadyStateAndMatchesMeasuredBytes) {
  for (const auto& p : Registry::instance().presets()) {
    auto m = make_method(p.name);
    const double steady = m->accounting(64).bits_per_element();
    // Long sequences: the fp16 windows amortize away (at most 2 * 256 + 2 * 128 fp16 tokens).
    EXPECT_NEAR(effective_bits(*m, 64, 1 << 16), steady, 16.0 * 768 / (1 << 16)) << p.name;
    EXPECT_GE(effective_bits(*m, 64, 1 << 16), steady - 1e-12) << p.name;
    Matrix k = testing::random_kv(333, 64, 5), v = testing::random_kv(333, 64, 6, false);
    const SequenceResult r = quantize_sequence(*m, k, v);
    EXPECT_DOUBLE_EQ(effective_bits(*m, 64, 333), r.stored_bytes * 8.0 / (333 * 128)) << p.name;
  }
}

TEST(EffectiveBits, StreamSpanAndErrors) {
  const StreamSpan s = stream_span({128, 128, 128}, 700);  // sink, chunk, keep_recent
  EXPECT_EQ(s.sink, 128);
  EXPECT_EQ(s.quantized, 384);  // (700 - 256) / 128 = 3 tiles
  EXPECT_EQ(s.tail, 188);
  EXPECT_EQ(s.quantized_end(), 512);
  const StreamSpan v = stream_span({0, 1, 128}, 100);  // KIVI values below the window
  EXPECT_EQ(v.quantized, 0);
  EXPECT_EQ(v.tail, 100);
  auto m = make_method("fp16");
  EXPECT_THROW(effective_bits(*m, 64, 0), Error);
  EXPECT_THROW(model_effective_bits(*m, 64, 10, 0), Error);
}

}  // namespace
}  // namespace kvarn
