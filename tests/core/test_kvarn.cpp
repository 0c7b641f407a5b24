#include "kvarn/core/kvarn.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "kvarn/core/pack.hpp"
#include "kvarn/core/registry.hpp"
#include "test_util.hpp"

namespace kvarn {
namespace {

KvarnConfig config(int kb, int vb, int g) {
  KvarnConfig c;
  c.key_bits = kb;
  c.value_bits = vb;
  c.group = g;
  return c;
}

TEST(KvarnRecord, UpstreamOffsetsForK4V2G128D128) {
  KvarnRecordLayout l = kvarn_record_layout(128, config(4, 2, 128));
  EXPECT_EQ(l.k_codes, 0u);
  EXPECT_EQ(l.s_col_k, 8192u);
  EXPECT_EQ(l.zp_k, 8448u);
  EXPECT_EQ(l.s_row_k, 8704u);
  EXPECT_EQ(l.v_codes, 8960u);
  EXPECT_EQ(l.s_col_v, 13056u);
  EXPECT_EQ(l.s_row_v, 13312u);
  EXPECT_EQ(l.zp_v, 13568u);
  EXPECT_EQ(l.end, 13824u);
  EXPECT_EQ(l.aligned, 13824u);
}

TEST(KvarnRecord, PresetSizesMatchUpstreamTable) {
  EXPECT_EQ(kvarn_record_layout(128, config(4, 4, 128)).aligned, 17920u);
  EXPECT_EQ(kvarn_record_layout(128, config(4, 2, 64)).aligned, 7296u);
  EXPECT_EQ(kvarn_record_layout(128, config(4, 4, 64)).aligned, 9344u);
  // head_dim 256: per-token slot rounded up to a power of two.
  EXPECT_EQ(kvarn_record_layout(256, config(4, 2, 128)).end, 26880u);
  EXPECT_EQ(kvarn_record_layout(256, config(4, 2, 128)).aligned, 32768u);
  EXPECT_EQ(kvarn_record_layout(256, config(4, 4, 128)).aligned, 65536u);
  KvarnConfig fp8 = config(4, 2, 128);
  fp8.scales = ScaleStorage::kFp8E4M3;
  EXPECT_EQ(kvarn_record_layout(128, fp8).aligned, 13312u);
}

TEST(KvarnRecord, AccountingIs108BytesPerTokenAtD128) {
  auto m = make_method("kvarn_k4v2_g128");
  Accounting a = m->accounting(128);
  EXPECT_DOUBLE_EQ(a.bytes_per_token(), 108.0);
  EXPECT_DOUBLE_EQ(a.key_code_bits, 4.0);
  EXPECT_DOUBLE_EQ(a.value_code_bits, 2.0);
  EXPECT_NEAR(a.capacity_vs_fp16(), 4.7407, 1e-4);
  EXPECT_DOUBLE_EQ(make_method("kvarn_k4v4_g128")->accounting(128).bytes_per_token(), 140.0);
  EXPECT_DOUBLE_EQ(make_method("kvarn_k4v2_g64")->accounting(128).bytes_per_token(), 114.0);
  EXPECT_DOUBLE_EQ(make_method("kvarn_k4v4_g64")->accounting(128).bytes_per_token(), 146.0);
}

// Dequantization identities hold bit for bit on the stored (fp16) scales, and the stages chain.
TEST(KvarnTile, StagesChainAndDequantIdentitiesHold) {
  const int d = 128, g = 128;
  KvarnConfig cfg = config(4, 2, g);
  Rotation rot(RotationKind::kHadamard, d);
  Matrix k = testing::random_kv(g, d, 21, true), v = testing::random_kv(g, d, 22, false, 0.5f);
  KvarnStreamStages ks, vs;
  auto rec = kvarn_encode_record(cfg, rot, k.data(), v.data(), &ks, &vs);
  ASSERT_EQ(rec.size(), 13824u);
  // rotated = fp16(x H)
  std::vector<float> r(k.data(), k.data() + k.size());
  rot.forward(r.data(), g);
  for (int i = 0; i < g * d; ++i) ASSERT_EQ(ks.rotated[i], round_to_half(r[i]));
  for (int c = 0; c < d; ++c)
    for (int t = 0; t < g; ++t) {
      const float q = ks.codes[c * g + t];
      ASSERT_EQ(ks.dequant_rotated[t * d + c], (q * ks.s_col[c] + ks.zp[c]) * ks.s_row[t]);
    }
  for (int t = 0; t < g; ++t)
    for (int c = 0; c < d; ++c) {
      const float q = vs.codes[t * d + c];
      ASSERT_EQ(vs.dequant_rotated[t * d + c], (q * vs.s_row[t] + vs.zp[t]) * vs.s_col[c]);
    }
  // Codes in the record are the packed stage codes.
  for (int c = 0; c < d; ++c)
    for (int t = 0; t < g; ++t)
      ASSERT_EQ(unpack_code(rec.data() + c * (g / 2), t, 4), ks.codes[c * g + t]);
  // Quality: 4-bit keys and 2-bit values of Gaussian-like data.
  Matrix kd = Eigen::Map<Matrix>(ks.dequant.data(), g, d), vd = Eigen::Map<Matrix>(vs.dequant.data(), g, d);
  EXPECT_LT(testing::nmse(k, kd), 0.02);
  EXPECT_LT(testing::nmse(v, vd), 0.3);  // 2-bit uniform on Gaussian rows: ~0.23
  EXPECT_LT(ks.varn.imbalance_after, ks.varn.imbalance_before);
}

TEST(KvarnTile, NormalizationLowersErrorAgainstPlainRtnOnOutlierKeys) {
  const int d = 128, g = 128;
  double with = 0, without = 0;
  for (int seed = 0; seed < 8; ++seed) {
    Matrix k = testing::random_kv(g, d, 300 + seed, true);
    for (int iters : {0, 8}) {
      KvarnConfig cfg = config(4, 2, g);
      cfg.varn.iters = iters;
      cfg.rotation = RotationKind::kNone;
      KvarnStreamStages st;
      std::vector<std::uint8_t> rec(kvarn_record_layout(d, cfg).aligned);
      kvarn_encode_stream(StreamKind::kKey, cfg, Rotation(RotationKind::kNone, d), k.data(),
                          rec.data(), &st);
      double e = testing::nmse(k, Eigen::Map<Matrix>(st.dequant.data(), g, d));
      (iters ? with : without) += e;
    }
  }
  EXPECT_LT(with, without);
}

// Every bit pair, group and head_dim encodes, decodes and stays within the RTN bound in the
// normalized domain.
TEST(KvarnTile, AllBitPairsGroupsAndHeadDims) {
  for (int g : {32, 64, 128, 256}) {
    for (int d : {64, 80, 96, 128, 256}) {
      KvarnConfig cfg = config(4, 2, g);
      Rotation rot(RotationKind::kHadamard, d);
      Matrix k = testing::random_kv(g, d, g * 1000 + d), v = testing::random_kv(g, d, g + d, false);
      KvarnStreamStages ks, vs;
      auto rec = kvarn_encode_record(cfg, rot, k.data(), v.data(), &ks, &vs);
      ASSERT_EQ(rec.size(), kvarn_record_layout(d, cfg).aligned);
      ASSERT_LT(testing::nmse(k, Eigen::Map<Matrix>(ks.dequant.data(), g, d)), 0.05) << g << " " << d;
    }
  }
  for (int kb = 1; kb <= 8; ++kb) {
    for (int vb = 1; vb <= 8; ++vb) {
      KvarnConfig cfg = config(kb, vb, 64);
      Rotation rot(RotationKind::kHadamard, 64);
      Matrix k = testing::random_kv(64, 64, kb * 10 + vb), v = testing::random_kv(64, 64, vb, false);
      KvarnStreamStages ks, vs;
      auto rec = kvarn_encode_record(cfg, rot, k.data(), v.data(), &ks, &vs);
      for (const KvarnStreamStages* st : {&ks, &vs}) {
        const int n = static_cast<int>(st->rtn_scale.size());
        const int cols = 64 * 64 / n;
        for (int r = 0; r < n; ++r)
          for (int c = 0; c < cols; ++c) {
            float xh = st->codes[r * cols + c] * st->rtn_scale[r] + st->rtn_lo[r];
            ASSERT_LE(std::fabs(xh - st->normalized[r * cols + c]), 0.5f * st->rtn_scale[r] * 1.0001f + 1e-6f);
          }
      }
    }
  }
}

TEST(KvarnTile, DegenerateTilesGiveFiniteReconstruction) {
  const int d = 128, g = 128;
  KvarnConfig cfg = config(4, 2, g);
  Rotation rot(RotationKind::kHadamard, d);
  Matrix zero = Matrix::Zero(g, d), outlier = testing::random_kv(g, d, 5, false);
  outlier(3, 4) = 60000.0f;
  Matrix constant = Matrix::Constant(g, d, 1.5f);
  Matrix subnormal = testing::random_kv(g, d, 6, false) * 3e-7f;
  for (const Matrix* m : {&zero, &outlier, &constant, &subnormal}) {
    KvarnStreamStages ks, vs;
    kvarn_encode_record(cfg, rot, m->data(), m->data(), &ks, &vs);
    for (float x : ks.dequant) ASSERT_TRUE(std::isfinite(x));
    for (float x : vs.dequant) ASSERT_TRUE(std::isfinite(x));
  }
  KvarnStreamStages zs, zv;
  kvarn_encode_record(cfg, rot, zero.data(), zero.data(), &zs, &zv);
  for (float x : zs.dequant) EXPECT_EQ(x, 0.0f);
}

TEST(KvarnCache, SinkAndTailStayFp16AndBytesMatchAccounting) {
  auto m = make_method("kvarn_k4v2_g128");
  const int d = 128;
  for (int t : {1, 100, 128, 129, 255, 256, 257, 600, 1000}) {
    Matrix k = testing::random_kv(t, d, t), v = testing::random_kv(t, d, t + 1, false);
    SequenceResult r = quantize_sequence(*m, k, v);
    const int full_tiles = t >= 128 ? (t - 128) / 128 : 0;
    for (int i = 0; i < t; ++i) {
      const bool q = i >= 128 && i < 128 + full_tiles * 128;
      ASSERT_EQ(r.k_quantized[i] != 0, q) << "T=" << t << " token " << i;
      ASSERT_EQ(r.v_quantized[i] != 0, q);
    }
    EXPECT_EQ(r.stored_bytes, m->sequence_bytes(t, d)) << "T=" << t;
    EXPECT_EQ(r.stored_bytes, static_cast<std::size_t>(full_tiles) * 13824 +
                                  static_cast<std::size_t>(t - full_tiles * 128) * 512);
    // Kept tokens are rotated fp16: error tiny but not exactly zero.
    if (t <= 128) {
      EXPECT_LT(testing::nmse(k, r.k_hat), 1e-6);
    }
  }
}

TEST(KvarnCache, StreamingEqualsOneBlock) {
  auto m = make_method("kvarn:k=4,v=2,g=64,sink=32");
  const int d = 64, t = 300;
  Matrix k = testing::random_kv(t, d, 1), v = testing::random_kv(t, d, 2, false);
  SequenceResult whole = quantize_sequence(*m, k, v);
  auto cache = m->make_cache(d);
  for (int i = 0; i < t; ++i) cache->append(k.row(i).data(), v.row(i).data(), 1);
  EXPECT_EQ(Matrix(cache->keys()), whole.k_hat);
  EXPECT_EQ(Matrix(cache->values()), whole.v_hat);
  EXPECT_EQ(cache->stored_bytes(), whole.stored_bytes);
  // sink of 32 tokens, then tiles of 64 starting at token 32.
  EXPECT_FALSE(cache->quantized(StreamKind::kKey, 31));
  EXPECT_TRUE(cache->quantized(StreamKind::kKey, 32));
  EXPECT_TRUE(cache->quantized(StreamKind::kKey, 32 + 4 * 64 - 1));
  EXPECT_FALSE(cache->quantized(StreamKind::kKey, 32 + 4 * 64));
}

TEST(KvarnCache, RejectsNonFiniteInputNamingThePlace) {
  auto m = make_method("kvarn_k4v2_g128");
  auto cache = m->make_cache(128);
  Matrix k = testing::random_kv(4, 128, 1), v = testing::random_kv(4, 128, 2);
  k(2, 5) = std::nanf("");
  try {
    cache->append(k.data(), v.data(), 4);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("row 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("column 5"), std::string::npos) << msg;
  }
  v(0, 0) = INFINITY;
  EXPECT_THROW(quantize_sequence(*m, testing::random_kv(4, 128, 1), v), std::exception);
}

TEST(KvarnMethod, AblationParametersTakeEffect) {
  const int d = 128, t = 512;
  Matrix k = testing::random_kv(t, d, 77), v = testing::random_kv(t, d, 78, false);
  auto base = quantize_sequence(*make_method("kvarn_k4v2_g128"), k, v);
  for (const char* spec : {"kvarn:k=4,v=2,g=128,rotation=none", "kvarn:k=4,v=2,g=128,rotation=haar,seed=3",
                           "kvarn:k=4,v=2,g=128,iters=0", "kvarn:k=4,v=2,g=128,quantile=0.01",
                           "kvarn:k=4,v=2,g=128,scales=fp8", "kvarn:k=4,v=2,g=128,sink=0"}) {
    auto m = make_method(spec);
    auto r = quantize_sequence(*m, k, v);
    EXPECT_NE(r.k_hat, base.k_hat) << spec;
    EXPECT_EQ(r.stored_bytes, m->sequence_bytes(t, d)) << spec;
    EXPECT_LT(testing::nmse(k, r.k_hat), 0.05) << spec;
  }
}

}  // namespace
}  // namespace kvarn
