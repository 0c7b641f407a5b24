#include <gtest/gtest.h>

#include <cmath>

#include "kvarn/core/pack.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/quarot.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/core/rotation.hpp"
#include "kvarn/data/error.hpp"
#include "test_util.hpp"

namespace kvarn {
namespace {

using testing::random_matrix;
using testing::half_at;

TEST(QuaRot, BytesPerTokenAtD128) {
  auto m = make_method("quarot_k4v4");
  EXPECT_EQ(m->accounting(128).bytes_per_token(), 136.0);
  EXPECT_EQ(m->accounting(128).bits_per_element(), 4.25);
  EXPECT_EQ(make_method("quarot:k_bits=4,v_bits=2,group=32")->accounting(128).bytes_per_token(),
            (64.0 + 16.0) + (32.0 + 16.0));
}

TEST(QuaRot, MeasuredBytesEqualAccounted) {
  for (const char* name : {"quarot_k4v4", "quarot_k3v2", "quarot:k_bits=4,v_bits=4,group=32",
                           "quarot:k_bits=8,v_bits=4,rotation=none"}) {
    auto m = make_method(name);
    for (int d : {64, 96, 128}) {
      for (int t : {1, 5, 33}) {
        Matrix k = random_matrix(t + d, t, d), v = random_matrix(t + 2 * d, t, d);
        SequenceResult r = quantize_sequence(*m, k, v);
        EXPECT_EQ(r.stored_bytes, m->sequence_bytes(t, d)) << name << " D=" << d << " T=" << t;
        for (int i = 0; i < t; ++i) EXPECT_TRUE(r.k_quantized[i] && r.v_quantized[i]);
      }
    }
  }
}

// Decode the stored codes/scale/zero in the rotated frame, compare with the rotated fp16 input
// (error <= scale/2) and with the reconstruction rotated forward.
TEST(QuaRot, StoredFieldsDecodeWithinHalfStepInRotatedFrame) {
  for (int group : {0, 32}) {
    auto m =
        make_method("quarot:k_bits=4,v_bits=3,group=" + (group ? std::to_string(group) : "head"));
    const int t = 40, d = 128, g = group ? group : d;
    Matrix k = random_matrix(81 + group, t, d, 1.5), v = random_matrix(82 + group, t, d, 0.5);
    k.col(17) *= 20.0f;  // an outlier channel, spread by the rotation
    SequenceResult s = quantize_sequence(*m, k, v);
    Rotation rot(RotationKind::kHadamard, d);
    for (int kind = 0; kind < 2; ++kind) {
      const Matrix& x = kind == 0 ? k : v;
      const Matrix& xh = kind == 0 ? s.k_hat : s.v_hat;
      const auto& chunks = kind == 0 ? s.k_chunks : s.v_chunks;
      const std::string p = kind == 0 ? "k_" : "v_";
      const int bits = kind == 0 ? 4 : 3;
      for (int i = 0; i < t; ++i) {
        std::vector<float> xr(d), hr(d);
        for (int c = 0; c < d; ++c) xr[c] = round_to_half(x(i, c)), hr[c] = xh(i, c);
        rot.forward(xr.data(), 1);
        rot.forward(hr.data(), 1);
        const Chunk& ch = chunks[i];
        const Field& codes = *ch.find(p + "codes");
        const Field& sc = *ch.find(p + "scale");
        const Field& zr = *ch.find(p + "zero");
        ASSERT_EQ(sc.bytes.size(), static_cast<std::size_t>(d / g) * 2);
        for (int c = 0; c < d; ++c) {
          const float s16 = half_at(sc, c / g), z16 = half_at(zr, c / g);
          EXPECT_EQ(z16, std::round(z16));  // integer zero-point
          const float q = unpack_code(codes.bytes.data(), c, bits);
          const float dq = s16 * (q - z16);
          EXPECT_NEAR(hr[c], dq, 1e-4f * (1.0f + std::abs(dq)));
          EXPECT_LE(std::abs(dq - round_to_half(xr[c])), 0.5f * s16 * 1.01f + 1e-5f);
        }
      }
    }
  }
}

TEST(QuaRot, RotationReducesOutlierError) {
  const int t = 64, d = 128;
  Matrix k = random_matrix(91, t, d);
  k.col(3) *= 50.0f;
  auto rotated = quantize_sequence(*make_method("quarot_k4v4"), k, k);
  auto plain = quantize_sequence(*make_method("quarot:k_bits=4,v_bits=4,rotation=none"), k, k);
  const float err_rot = (rotated.k_hat - k).squaredNorm(),
              err_plain = (plain.k_hat - k).squaredNorm();
  EXPECT_LT(err_rot, 0.5f * err_plain);
}

TEST(QuaRot, ZeroGroupUsesPlusMinusOneRange) {
  const float x[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::uint8_t q[8];
  float rec[8];
  std::uint16_t sb, zb;
  quarot_quantize_group(x, 8, 4, 1.0f, q, rec, &sb, &zb);
  EXPECT_EQ(half_bits_to_float(sb), round_to_half(2.0f / 15.0f));
  const float s16 = half_bits_to_float(sb);
  EXPECT_EQ(half_bits_to_float(zb), round_half_even(1.0f / s16));  // zero = round(-xmin / scale)
  for (float r : rec) EXPECT_EQ(r, 0.0f);
}

TEST(QuaRot, ClipShrinksTheRange) {
  Rng rng(5);
  float x[64];
  for (float& v : x) v = static_cast<float>(rng.normal());
  std::uint8_t q[64];
  float rec[64];
  std::uint16_t s1, z1, s9, z9;
  quarot_quantize_group(x, 64, 4, 1.0f, q, rec, &s1, &z1);
  quarot_quantize_group(x, 64, 4, 0.9f, q, rec, &s9, &z9);
  EXPECT_NEAR(half_bits_to_float(s9) / half_bits_to_float(s1), 0.9f, 2e-3f);
}

TEST(QuaRot, DegenerateInputsStayFinite) {
  const int t = 6, d = 64;
  for (const char* name : {"quarot_k4v4", "quarot:k_bits=4,v_bits=4,rotation=none",
                           "quarot:k_bits=2,v_bits=2,group=8,rotation=none"}) {
    auto m = make_method(name);
    Matrix zero = Matrix::Zero(t, d), constant = Matrix::Constant(t, d, 3.0f);
    Matrix outlier = random_matrix(101, t, d);
    outlier(2, 9) = 6.0e4f;
    Matrix sub = random_matrix(102, t, d, 1e-6);
    Matrix far = Matrix::Constant(t, d, 1000.0f) + random_matrix(103, t, d, 1e-2);
    for (const Matrix* x : {&zero, &constant, &outlier, &sub, &far}) {
      SequenceResult r = quantize_sequence(*m, *x, *x);
      EXPECT_TRUE(r.k_hat.allFinite() && r.v_hat.allFinite()) << name;
    }
    SequenceResult rz = quantize_sequence(*m, zero, zero);
    EXPECT_TRUE(rz.k_hat.isZero(0)) << name;
    SequenceResult rc = quantize_sequence(*m, constant, constant);
    EXPECT_LT((rc.k_hat - constant).cwiseAbs().maxCoeff(), 0.05f) << name;
  }
}

TEST(QuaRot, RegistryNamesSpecsAndErrors) {
  auto m = make_method("quarot_k4v4");
  EXPECT_EQ(m->name(), "quarot_k4v4");
  EXPECT_EQ(m->family(), "quarot");
  EXPECT_EQ(m->spec(), "quarot:k_bits=4,v_bits=4,group=head,clip=1,rotation=hadamard");
  EXPECT_EQ(make_method(m->spec())->name(), "quarot_k4v4");
  EXPECT_EQ(make_method("quarot_k3v2")->spec(),
            "quarot:k_bits=3,v_bits=2,group=head,clip=1,rotation=hadamard");
  for (const char* spec : {"quarot:k_bits=4,v_bits=4,group=32,clip=0.9,rotation=none",
                           "quarot:k_bits=2,v_bits=4,rotation=haar,seed=7"}) {
    auto c = make_method(spec);
    EXPECT_EQ(make_method(c->spec())->spec(), c->spec());
    EXPECT_EQ(make_method(c->name())->spec(), c->spec());
  }
  try {
    make_method("quarot:kbits=4");
    FAIL() << "unknown key accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("k_bits"), std::string::npos) << msg;
    EXPECT_NE(msg.find("clip"), std::string::npos) << msg;
  }
  EXPECT_THROW(make_method("quarot:clip=1.5"), Error);
  EXPECT_THROW(make_method("quarot_k4v4")->accounting(72), Error);  // no Hadamard of order 72
  EXPECT_THROW(make_method("quarot:group=48")->accounting(128), Error);
}

}  // namespace
}  // namespace kvarn
