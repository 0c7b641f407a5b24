#include <gtest/gtest.h>

#include <cmath>

#include "kvarn/core/kivi.hpp"
#include "kvarn/core/pack.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/data/error.hpp"
#include "test_util.hpp"

namespace kvarn {
namespace {

using testing::random_matrix;
using testing::half_at;

TEST(Kivi, BytesPerTokenAtD128) {
  // 2 streams x (D*b/8 codes + D/32 groups x 4 B): 3.0 / 5.0 bits per element.
  EXPECT_EQ(make_method("kivi_2bit")->accounting(128).bytes_per_token(), 96.0);
  EXPECT_EQ(make_method("kivi_4bit")->accounting(128).bytes_per_token(), 160.0);
  EXPECT_EQ(make_method("kivi_2bit")->accounting(128).bits_per_element(), 3.0);
  EXPECT_EQ(make_method("kivi_4bit")->accounting(128).bits_per_element(), 5.0);
  EXPECT_EQ(make_method("kivi:bits=2,group=64,residual=128")->accounting(128).bytes_per_token(),
            80.0);
}

TEST(Kivi, MeasuredBytesEqualAccounted) {
  for (const char* name : {"kivi_2bit", "kivi_4bit", "kivi:bits=2,group=16,residual=48",
                           "kivi:bits=4,group=32,residual=32"}) {
    auto m = make_method(name);
    for (int d : {64, 128}) {
      for (int t : {1, 31, 32, 47, 127, 128, 129, 300}) {
        Matrix k = random_matrix(t * 3 + d, t, d), v = random_matrix(t * 5 + d, t, d);
        SequenceResult r = quantize_sequence(*m, k, v);
        EXPECT_EQ(r.stored_bytes, m->sequence_bytes(t, d)) << name << " D=" << d << " T=" << t;
      }
    }
  }
  // Hand count, kivi_2bit D=128 T=300: 2 key chunks of 128 (48 B/token) + 44 fp16 keys,
  // 172 quantized values (48 B) + 128 fp16 values.
  EXPECT_EQ(make_method("kivi_2bit")->sequence_bytes(300, 128),
            256u * 48 + 44u * 256 + 172u * 48 + 128u * 256);
}

TEST(Kivi, FlushRules) {
  auto m = make_method("kivi:bits=2,group=32,residual=64");
  const int r = 64, d = 64;
  for (int t : {1, 63, 64, 65, 100, 200}) {
    Matrix k = random_matrix(t, t, d), v = random_matrix(t + 1, t, d);
    SequenceResult s = quantize_sequence(*m, k, v);
    int k_fp16 = 0, v_fp16 = 0;
    for (int i = 0; i < t; ++i) {
      k_fp16 += !s.k_quantized[i];
      v_fp16 += !s.v_quantized[i];
      EXPECT_EQ(s.k_quantized[i], i < t - t % r) << "key " << i << " T=" << t;
      EXPECT_EQ(s.v_quantized[i], i < t - r) << "value " << i << " T=" << t;
    }
    EXPECT_EQ(k_fp16, t % r);
    EXPECT_EQ(v_fp16, std::min(t, r));
    // fp16-kept tokens read back as their fp16 values
    for (int i = 0; i < t; ++i) {
      if (!s.k_quantized[i]) {
        EXPECT_EQ(s.k_hat(i, 3), round_to_half(k(i, 3)));
      }
      if (!s.v_quantized[i]) {
        EXPECT_EQ(s.v_hat(i, 5), round_to_half(v(i, 5)));
      }
    }
  }
}

TEST(Kivi, StreamingOneTokenAtATimeEqualsBlockAppend) {
  auto m = make_method("kivi:bits=2,group=16,residual=32");
  const int t = 103, d = 64;
  Matrix k = random_matrix(51, t, d), v = random_matrix(52, t, d);
  SequenceResult block = quantize_sequence(*m, k, v);
  auto cache = m->make_cache(d);
  for (int i = 0; i < t; ++i) cache->append(k.row(i).data(), v.row(i).data(), 1);
  EXPECT_EQ(Matrix(cache->keys()), block.k_hat);
  EXPECT_EQ(Matrix(cache->values()), block.v_hat);
  EXPECT_EQ(cache->stored_bytes(), block.stored_bytes);
  ASSERT_EQ(cache->chunks(StreamKind::kKey).size(), block.k_chunks.size());
  for (std::size_t c = 0; c < block.k_chunks.size(); ++c)
    for (std::size_t f = 0; f < block.k_chunks[c].fields.size(); ++f)
      EXPECT_EQ(cache->chunks(StreamKind::kKey)[c].fields[f].bytes,
                block.k_chunks[c].fields[f].bytes);
}

// Decodes every stored chunk (codes, fp16 scale/min) and checks it is the reconstruction, and that
// the RTN error is at most half a step.
TEST(Kivi, StoredFieldsDecodeToReconstructionWithinHalfStep) {
  for (int bits : {2, 4}) {
    auto m = make_method("kivi:bits=" + std::to_string(bits) + ",group=32,residual=64");
    const int t = 200, d = 128, g = 32, r = 64;
    Matrix k = random_matrix(61 + bits, t, d, 2.0), v = random_matrix(62 + bits, t, d, 0.7);
    SequenceResult s = quantize_sequence(*m, k, v);
    ASSERT_EQ(s.k_chunks.size(), 3u);
    for (const Chunk& ch : s.k_chunks) {
      const Field& codes = *ch.find("k_codes");
      const Field& sc = *ch.find("k_scale");
      const Field& mn = *ch.find("k_min");
      ASSERT_EQ(codes.bytes.size(), static_cast<std::size_t>(d) * r * bits / 8);
      for (int c = 0; c < d; ++c) {
        for (int i = 0; i < r; ++i) {
          const std::size_t gi = static_cast<std::size_t>(c) * (r / g) + i / g;
          const float s16 = half_at(sc, gi), m16 = half_at(mn, gi);
          const float q = unpack_code(codes.bytes.data() + c * packed_bytes(r, bits), i, bits);
          const int tok = ch.first_token + i;
          EXPECT_EQ(s.k_hat(tok, c), q * s16 + m16);
          EXPECT_LE(std::abs(s.k_hat(tok, c) - round_to_half(k(tok, c))),
                    0.5f * s16 * 1.01f + 1e-6f);
        }
      }
    }
    for (const Chunk& ch : s.v_chunks) {
      const Field& codes = *ch.find("v_codes");
      const Field& sc = *ch.find("v_scale");
      const Field& mn = *ch.find("v_min");
      const int tok = ch.first_token;
      for (int c = 0; c < d; ++c) {
        const float s16 = half_at(sc, c / g), m16 = half_at(mn, c / g);
        const float q = unpack_code(codes.bytes.data(), c, bits);
        EXPECT_EQ(s.v_hat(tok, c), q * s16 + m16);
        EXPECT_LE(std::abs(s.v_hat(tok, c) - round_to_half(v(tok, c))), 0.5f * s16 * 1.01f + 1e-6f);
      }
    }
  }
}

TEST(Kivi, QuantizerRoundsHalfToEvenAfterClamp) {
  // Group {0, 1, 2, 3} at 2 bits: scale 1, codes exact; {0, 0.5, 1.5, 3}: 0.5 -> 0, 1.5 -> 2.
  const float x[4] = {0.0f, 0.5f, 1.5f, 3.0f};
  std::uint8_t q[4];
  float rec[4];
  std::uint16_t sb, mb;
  kivi_quantize_group(x, 4, 1, 2, q, rec, &sb, &mb);
  EXPECT_EQ(half_bits_to_float(sb), 1.0f);
  EXPECT_EQ(half_bits_to_float(mb), 0.0f);
  EXPECT_EQ(q[0], 0);
  EXPECT_EQ(q[1], 0);
  EXPECT_EQ(q[2], 2);
  EXPECT_EQ(q[3], 3);
}

TEST(Kivi, DegenerateInputsStayFinite) {
  const int t = 140, d = 64;
  for (const char* name : {"kivi_2bit", "kivi_4bit"}) {
    auto m = make_method(name);
    Matrix zero = Matrix::Zero(t, d), constant = Matrix::Constant(t, d, -2.25f);
    Matrix outlier = random_matrix(71, t, d);
    outlier(5, 7) = 6.0e4f;
    outlier(6, 7) = -6.0e4f;  // fp16 range of the group overflows; scale must not
    Matrix sub = random_matrix(72, t, d, 1e-6);
    for (const Matrix* x : {&zero, &constant, &outlier, &sub}) {
      SequenceResult r = quantize_sequence(*m, *x, *x);
      EXPECT_TRUE(r.k_hat.allFinite() && r.v_hat.allFinite()) << name;
    }
    // Constant groups (zero range) reconstruct exactly.
    SequenceResult rc = quantize_sequence(*m, constant, constant);
    EXPECT_TRUE((rc.k_hat.array() == -2.25f).all());
    EXPECT_TRUE((rc.v_hat.array() == -2.25f).all());
    SequenceResult rz = quantize_sequence(*m, zero, zero);
    EXPECT_TRUE(rz.k_hat.isZero(0) && rz.v_hat.isZero(0));
  }
}

TEST(Kivi, RegistryNamesSpecsAndErrors) {
  for (const char* name : {"kivi_2bit", "kivi_4bit"}) {
    auto m = make_method(name);
    EXPECT_EQ(m->name(), name);
    EXPECT_EQ(m->family(), "kivi");
    EXPECT_EQ(make_method(m->spec())->spec(), m->spec());
  }
  EXPECT_EQ(make_method("kivi_2bit")->spec(), "kivi:bits=2,group=32,residual=128");
  auto c = make_method("kivi:bits=4,group=16,residual=32");
  EXPECT_EQ(c->name(), c->spec());
  EXPECT_EQ(make_method(c->spec())->spec(), c->spec());
  try {
    make_method("kivi:bits=2,resid=128");
    FAIL() << "unknown key accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("residual"), std::string::npos) << msg;
    EXPECT_NE(msg.find("group"), std::string::npos) << msg;
  }
  EXPECT_THROW(make_method("kivi:bits=3"), Error);
  EXPECT_THROW(make_method("kivi:group=32,residual=48"), Error);  // not a multiple of group
  EXPECT_THROW(make_method("kivi:group=48,residual=96")->accounting(128), Error);  // D % group != 0
}

}  // namespace
}  // namespace kvarn
