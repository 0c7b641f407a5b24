#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kvarn/core/fp8.hpp"
#include "kvarn/core/lloyd_max.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/core/rotation.hpp"
#include "kvarn/core/turboquant.hpp"
#include "kvarn/data/error.hpp"
#include "test_util.hpp"

namespace kvarn {
namespace {

using testing::random_matrix;
using testing::half_at;

struct SlotCase {
  const char* name;
  double key, value;
};
const SlotCase kSlots[] = {{"turboquant_k8v4", 128, 68},
                           {"turboquant_4bit_nc", 66, 68},
                           {"turboquant_k3v4_nc", 50, 68},
                           {"turboquant_3bit_nc", 50, 52}};

TEST(TurboQuant, SlotBytesAtD128MatchVllm) {
  for (const auto& c : kSlots) {
    const Accounting a = make_method(c.name)->accounting(128);
    EXPECT_EQ(a.key_bytes_per_token, c.key) << c.name;
    EXPECT_EQ(a.value_bytes_per_token, c.value) << c.name;
  }
  EXPECT_EQ(make_method("turboquant_k8v4")->accounting(128).bytes_per_token(), 196.0);
  EXPECT_EQ(make_method("turboquant_4bit_nc")->accounting(128).bytes_per_token(), 134.0);
  EXPECT_EQ(make_method("turboquant_k3v4_nc")->accounting(128).bytes_per_token(), 118.0);
  EXPECT_EQ(make_method("turboquant_3bit_nc")->accounting(128).bytes_per_token(), 102.0);
  // Odd slot rounded up to even: D=8, k4 (4+2) + v3 (3+4) = 13 -> 14.
  EXPECT_EQ(make_method("turboquant:k=4,v=3")->accounting(8).bytes_per_token(), 14.0);
}

TEST(TurboQuant, MeasuredBytesEqualAccountedIncludingBoundaryLayers) {
  for (const char* name :
       {"turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
        "turboquant:k=4,v=3,boundary=0", "turboquant:k=2,v=2,nc=0"}) {
    auto m = make_method(name);
    for (int d : {8, 64, 128}) {
      for (int t : {1, 3, 17}) {
        Matrix k = random_matrix(t + d, t, d), v = random_matrix(t + 3 * d, t, d);
        for (int layer : {0, 1, 2, 15, 29, 30, 31}) {
          const LayerContext ctx{layer, 32};
          SequenceResult r = quantize_sequence(*m, k, v, ctx);
          EXPECT_EQ(r.stored_bytes, m->sequence_bytes(t, d, ctx))
              << name << " D=" << d << " T=" << t << " layer " << layer;
          if (m->layer_skipped(ctx)) {
            EXPECT_EQ(r.stored_bytes, static_cast<std::size_t>(4 * d * t));
          }
        }
      }
    }
  }
}

TEST(TurboQuant, BoundaryLayersFirstAndLastTwoCappedAtHalf) {
  auto m = make_method("turboquant_4bit_nc");
  for (int l = 0; l < 32; ++l)
    EXPECT_EQ(m->layer_skipped({l, 32}), l < 2 || l >= 30) << "layer " << l;
  // Capped at num_layers / 2: 3 layers -> 1 on each side.
  EXPECT_TRUE(m->layer_skipped({0, 3}));
  EXPECT_FALSE(m->layer_skipped({1, 3}));
  EXPECT_TRUE(m->layer_skipped({2, 3}));
  EXPECT_FALSE(m->layer_skipped({0, 1}));  // the default context: one layer, nothing skipped
  auto none = make_method("turboquant:k=4,v=4,nc=1,boundary=0");
  for (int l = 0; l < 32; ++l) EXPECT_FALSE(none->layer_skipped({l, 32}));
  auto wide = make_method("turboquant:k=3,v=3,skip_layers=4");
  EXPECT_TRUE(wide->layer_skipped({3, 32}));
  EXPECT_FALSE(wide->layer_skipped({4, 32}));
  // A skipped layer reads back fp16 exactly.
  Matrix k = random_matrix(5, 4, 128), v = random_matrix(6, 4, 128);
  SequenceResult r = quantize_sequence(*m, k, v, {31, 32});
  for (int i = 0; i < 4; ++i)
    for (int c = 0; c < 128; ++c) EXPECT_EQ(r.k_hat(i, c), round_to_half(k(i, c)));
}

TEST(TurboQuant, BitstreamPackingMatchesVllmLayout) {
  std::uint8_t codes[8] = {0, 1, 2, 3, 4, 5, 6, 7}, out[3];
  bitstream_pack(codes, 8, 3, out);
  std::uint32_t word = 0;
  for (int j = 0; j < 8; ++j) word |= static_cast<std::uint32_t>(codes[j]) << (3 * j);
  EXPECT_EQ(out[0], word & 0xff);
  EXPECT_EQ(out[1], (word >> 8) & 0xff);
  EXPECT_EQ(out[2], (word >> 16) & 0xff);
  for (int j = 0; j < 8; ++j) EXPECT_EQ(bitstream_code(out, j, 3), codes[j]);
  std::uint8_t nib[2] = {0x1, 0xa}, packed;
  bitstream_pack(nib, 2, 4, &packed);
  EXPECT_EQ(packed, 0xa1);  // low nibble = even index
}

// Decode each stored key (indices, fp16 norm) with the fp32 codebook and check it is k_hat.
TEST(TurboQuant, KeysDecodeFromStoredFieldsAndNormCorrectionKeepsNorm) {
  const int t = 50, d = 128;
  Matrix k = random_matrix(111, t, d, 3.0), v = random_matrix(112, t, d);
  k.col(4) *= 10.0f;
  Rotation rot(RotationKind::kHadamard, d);
  for (int bits : {3, 4}) {
    for (bool nc : {true, false}) {
      auto m = make_method("turboquant:k=" + std::to_string(bits) + ",v=4,nc=" + (nc ? "1" : "0"));
      SequenceResult s = quantize_sequence(*m, k, v);
      const ScalarCodebook& cb = vllm_turboquant_codebook(d, bits);
      double norm_err_nc = 0;
      for (int i = 0; i < t; ++i) {
        const Field& idx = *s.k_chunks[i].find("k_idx");
        const float n16 = half_at(*s.k_chunks[i].find("k_norm"), 0);
        Eigen::VectorXf kh =
            k.row(i).transpose().unaryExpr([](float x) { return round_to_half(x); });
        EXPECT_EQ(n16, round_to_half(kh.norm()));
        std::vector<float> c(d);
        float sq = 0;
        for (int j = 0; j < d; ++j) {
          c[j] = cb.centroids[bitstream_code(idx.bytes.data(), j, bits)];
          sq += c[j] * c[j];
        }
        for (int j = 0; j < d; ++j) c[j] = n16 * (nc ? c[j] / std::sqrt(sq + 1e-16f) : c[j]);
        rot.inverse(c.data(), 1);
        for (int j = 0; j < d; ++j) EXPECT_NEAR(s.k_hat(i, j), c[j], 1e-5f * n16);
        const float hat_norm = s.k_hat.row(i).norm();
        if (nc) {
          EXPECT_NEAR(hat_norm, n16, 2e-6f * n16);
        }
        norm_err_nc += std::abs(hat_norm - n16) / n16;
      }
      if (!nc) {
        EXPECT_GT(norm_err_nc / t, 1e-3);  // without NC the norm is off
      }
      // Relative key error in the expected range for Lloyd-Max at this width.
      const double rel = (s.k_hat - k).squaredNorm() / k.squaredNorm();
      EXPECT_LT(rel, bits == 4 ? 0.02 : 0.06) << bits << " nc " << nc;
    }
  }
}

TEST(TurboQuant, K8v4KeysAreUnscaledFp8) {
  const int t = 5, d = 64;
  Matrix k = random_matrix(121, t, d, 100.0), v = random_matrix(122, t, d);
  SequenceResult s = quantize_sequence(*make_method("turboquant_k8v4"), k, v);
  for (int i = 0; i < t; ++i)
    for (int c = 0; c < d; ++c)
      EXPECT_EQ(s.k_hat(i, c),
                fp8_bits_to_float(float_to_fp8_bits(round_to_half(k(i, c)), Fp8Format::kE4M3),
                                  Fp8Format::kE4M3));
}

TEST(TurboQuant, ValuesHalfUpRtnWithinHalfStep) {
  const int t = 60, d = 128;
  Matrix k = random_matrix(131, t, d), v = random_matrix(132, t, d, 2.0);
  for (const char* name : {"turboquant_4bit_nc", "turboquant_3bit_nc"}) {
    const int bits = std::string(name) == "turboquant_4bit_nc" ? 4 : 3;
    SequenceResult s = quantize_sequence(*make_method(name), k, v);
    for (int i = 0; i < t; ++i) {
      const Field& codes = *s.v_chunks[i].find("v_codes");
      const Field& meta = *s.v_chunks[i].find("v_scale_min");
      const float s16 = half_at(meta, 0), m16 = half_at(meta, 1);
      for (int c = 0; c < d; ++c) {
        const float q = bitstream_code(codes.bytes.data(), c, bits);
        EXPECT_EQ(s.v_hat(i, c), q * s16 + m16);
        EXPECT_LE(std::abs(s.v_hat(i, c) - round_to_half(v(i, c))), 0.5f * s16 * 1.01f + 1e-3f);
      }
    }
  }
  // Half-up: {0, 0.5, 1, ..., 7}: scale 1, 0.5 -> 1 (half-even would give 0).
  float x[9] = {0, 0.5f, 1, 2, 3, 4, 5, 6, 7}, rec[9];
  std::uint8_t q[9];
  std::uint16_t sb, mb;
  turboquant_quantize_value(x, 9, 3, q, rec, &sb, &mb);
  EXPECT_EQ(half_bits_to_float(sb), 1.0f);
  EXPECT_EQ(q[1], 1);
  EXPECT_EQ(q[8], 7);
}

TEST(TurboQuant, DegenerateInputsStayFinite) {
  const int t = 5, d = 128;
  for (const char* name :
       {"turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
        "turboquant_mse_3bit", "turboquant_prod_3bit", "turboquant_prod_1bit"}) {
    auto m = make_method(name);
    Matrix zero = Matrix::Zero(t, d), constant = Matrix::Constant(t, d, 7.0f);
    Matrix outlier = random_matrix(141, t, d);
    outlier(1, 3) = 6.0e4f;
    outlier(2, 3) = 6.0e4f;
    outlier(2, 4) = -6.0e4f;  // norm above the fp16 maximum
    Matrix sub = random_matrix(142, t, d, 1e-6);
    for (const Matrix* x : {&zero, &constant, &outlier, &sub}) {
      SequenceResult r = quantize_sequence(*m, *x, *x);
      EXPECT_TRUE(r.k_hat.allFinite() && r.v_hat.allFinite()) << name;
    }
    SequenceResult rz = quantize_sequence(*m, zero, zero);
    EXPECT_TRUE(rz.k_hat.isZero(0) && rz.v_hat.isZero(0)) << name;
  }
}

TEST(TurboQuantPaper, BytesAndDistortion) {
  const int d = 128;
  EXPECT_EQ(make_method("turboquant_mse_3bit")->accounting(d).bytes_per_token(), 2.0 * (48 + 2));
  EXPECT_EQ(make_method("turboquant_prod_3bit")->accounting(d).bytes_per_token(),
            2.0 * (32 + 2 + 16 + 2));
  EXPECT_EQ(make_method("turboquant_prod_1bit")->accounting(d).bytes_per_token(),
            2.0 * (2 + 16 + 2));
  const double paper[] = {0.36, 0.117, 0.034, 0.0093};
  const int t = 300;
  Matrix k = random_matrix(151, t, d, 2.0), v = random_matrix(152, t, d, 0.3);
  for (int b = 1; b <= 4; ++b) {
    auto m = make_method("turboquant_mse_" + std::to_string(b) + "bit");
    SequenceResult s = quantize_sequence(*m, k, v);
    EXPECT_EQ(s.stored_bytes, m->sequence_bytes(t, d));
    double nmse = 0;
    for (int i = 0; i < t; ++i)
      nmse += (s.k_hat.row(i) - k.row(i)).squaredNorm() / k.row(i).squaredNorm();
    nmse /= t;
    EXPECT_NEAR(nmse, paper[b - 1], 0.15 * paper[b - 1]) << "bits " << b;
  }
  for (int t2 : {1, 7}) {
    auto m = make_method("turboquant_prod_2bit");
    Matrix k2 = random_matrix(153 + t2, t2, 64), v2 = random_matrix(154 + t2, t2, 64);
    EXPECT_EQ(quantize_sequence(*m, k2, v2).stored_bytes, m->sequence_bytes(t2, 64));
  }
}

TEST(TurboQuantPaper, ProdInnerProductsAreUnbiased) {
  const int t = 400, d = 64;
  Matrix k = random_matrix(161, t, d), v = random_matrix(162, t, d);
  Rng rng(163);
  Eigen::VectorXf q(d);
  for (int j = 0; j < d; ++j) q(j) = static_cast<float>(rng.normal());
  for (const char* name : {"turboquant_prod_2bit", "turboquant_mse_1bit"}) {
    SequenceResult s = quantize_sequence(*make_method(name), k, v);
    double num = 0, den = 0;
    for (int i = 0; i < t; ++i) {
      const double ip = k.row(i).dot(q), iph = s.k_hat.row(i).dot(q);
      num += ip * iph;
      den += ip * ip;
    }
    // Regression slope of <q, k_hat> on <q, k>: 1 for prod, 2/pi for 1-bit mse (paper).
    const double slope = num / den;
    if (std::string(name) == "turboquant_prod_2bit") {
      EXPECT_NEAR(slope, 1.0, 0.08);
    } else {
      EXPECT_NEAR(slope, 2.0 / 3.14159265358979, 0.08);
    }
  }
}

TEST(TurboQuantPaper, SeedDeterminesRotation) {
  const int t = 3, d = 64;
  Matrix k = random_matrix(171, t, d), v = random_matrix(172, t, d);
  auto a = quantize_sequence(*make_method("turboquant_mse_2bit"), k, v);
  auto b = quantize_sequence(*make_method("turboquant_mse_2bit"), k, v);
  auto c = quantize_sequence(*make_method("turboquant_paper:mode=mse,bits=2,seed=9"), k, v);
  EXPECT_EQ(a.k_hat, b.k_hat);
  EXPECT_NE(a.k_hat, c.k_hat);
}

TEST(TurboQuant, RegistryPresetsNamesSpecsAndErrors) {
  for (const auto& p : Registry::instance().presets()) {
    if (p.name.rfind("turboquant", 0) != 0) continue;
    auto m = make_method(p.name);
    EXPECT_EQ(m->name(), p.name);
    EXPECT_EQ(make_method(m->spec())->spec(), m->spec()) << p.name;
    EXPECT_EQ(make_method(m->spec())->name(), p.name);
  }
  EXPECT_EQ(make_method("turboquant_4bit_nc")->spec(), "turboquant:k=4,v=4,nc=1,boundary=2");
  EXPECT_EQ(make_method("turboquant_k8v4")->spec(), "turboquant:k=8,v=4,nc=0,boundary=2");
  auto b0 = make_method("turboquant:k=3,v=4,nc=1,boundary=0");
  EXPECT_EQ(b0->name(), b0->spec());
  EXPECT_EQ(make_method(b0->spec())->spec(), b0->spec());
  EXPECT_EQ(make_method("turboquant:k=3,v=4,skip_layers=0")->spec(), b0->spec());
  EXPECT_EQ(make_method("turboquant_prod_5bit")->spec(),
            "turboquant_paper:mode=prod,bits=5,seed=0");
  try {
    make_method("turboquant:k=4,v=4,bondary=0");
    FAIL() << "unknown key accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("boundary"), std::string::npos) << msg;
    EXPECT_NE(msg.find("nc"), std::string::npos) << msg;
  }
  EXPECT_THROW(make_method("turboquant:k=5"), Error);
  EXPECT_THROW(make_method("turboquant:k=8,nc=1"), Error);
  EXPECT_THROW(make_method("turboquant:boundary=1,skip_layers=1"), Error);
  EXPECT_THROW(make_method("turboquant_mse_5bit"), Error);
  EXPECT_THROW(make_method("turboquant_paper:mode=qjl"), Error);
}

TEST(BaselinePresets, AllConstructRoundTripAndAccountExactly) {
  const std::vector<std::string> families = {"fp8", "kivi", "quarot", "turboquant",
                                             "turboquant_paper"};
  int seen = 0;
  for (const auto& p : Registry::instance().presets()) {
    auto m = make_method(p.name);
    if (std::find(families.begin(), families.end(), m->family()) == families.end()) continue;
    ++seen;
    EXPECT_EQ(m->name(), p.name);
    EXPECT_EQ(make_method(m->spec())->spec(), m->spec()) << p.name;
    EXPECT_FALSE(m->description().empty());
    for (int t : {1, 130}) {
      Matrix k = random_matrix(181 + t, t, 128), v = random_matrix(182 + t, t, 128);
      for (const LayerContext ctx : {LayerContext{0, 32}, LayerContext{16, 32}}) {
        EXPECT_EQ(quantize_sequence(*m, k, v, ctx).stored_bytes, m->sequence_bytes(t, 128, ctx))
            << p.name << " T=" << t << " layer " << ctx.layer;
      }
    }
  }
  EXPECT_EQ(seen, 2 + 3 + 1 + 4 + 7);  // fp8, kivi (2bit, 4bit, k4v2), quarot, tq, tq_paper
}

}  // namespace
}  // namespace kvarn
