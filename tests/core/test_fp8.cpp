#include <gtest/gtest.h>

#include <cmath>

#include "kvarn/core/fp8.hpp"
#include "kvarn/core/registry.hpp"
#include "kvarn/core/rng.hpp"
#include "kvarn/data/error.hpp"
#include "test_util.hpp"

namespace kvarn {
namespace {

using testing::random_matrix;

bool all_finite(const Matrix& m) { return m.allFinite(); }

TEST(Fp8, BytesPerTokenAndMeasuredEqualAccounted) {
  for (const char* name : {"fp8_e4m3", "fp8_e5m2", "fp8:format=e4m3,scale=calibrated",
                           "fp8:format=e5m2,scale=0.5,granularity=head"}) {
    auto m = make_method(name);
    EXPECT_EQ(m->accounting(128).bytes_per_token(), 256.0) << name;
    EXPECT_EQ(m->accounting(128).bits_per_element(), 8.0) << name;
    for (int t : {1, 7, 33, 130}) {
      Matrix k = random_matrix(t, t, 128), v = random_matrix(t + 100, t, 128);
      SequenceResult r = quantize_sequence(*m, k, v);
      EXPECT_EQ(r.stored_bytes, m->sequence_bytes(t, 128)) << name << " T=" << t;
      EXPECT_EQ(r.stored_bytes, static_cast<std::size_t>(256 * t)) << name << " T=" << t;
      for (int i = 0; i < t; ++i) EXPECT_TRUE(r.k_quantized[i] && r.v_quantized[i]);
    }
  }
}

TEST(Fp8, E4m3RelativeErrorInNormalRange) {
  auto m = make_method("fp8_e4m3");
  Rng rng(7);
  const int t = 64, d = 128;
  Matrix k(t, d), v(t, d);
  for (int r = 0; r < t; ++r) {
    for (int c = 0; c < d; ++c) {
      // log-uniform magnitudes over the e4m3 normal range [2^-6, 448]
      const double e = -6.0 + (std::log2(448.0) + 6.0) * rng.uniform();
      k(r, c) = round_to_half(static_cast<float>((rng.uniform() < 0.5 ? -1 : 1) * std::exp2(e)));
      v(r, c) = k(r, c);
    }
  }
  SequenceResult r = quantize_sequence(*m, k, v);
  for (int i = 0; i < t; ++i) {
    for (int c = 0; c < d; ++c) {
      EXPECT_LE(std::abs(r.k_hat(i, c) - k(i, c)), 0.0625f * std::abs(k(i, c)));
      EXPECT_LE(std::abs(r.v_hat(i, c) - v(i, c)), 0.0625f * std::abs(v(i, c)));
    }
  }
  auto m5 = make_method("fp8_e5m2");
  SequenceResult r5 = quantize_sequence(*m5, k, v);
  for (int i = 0; i < t; ++i)
    for (int c = 0; c < d; ++c)
      EXPECT_LE(std::abs(r5.k_hat(i, c) - k(i, c)), 0.125f * std::abs(k(i, c)));
}

TEST(Fp8, SaturatesAtFormatMaximum) {
  Matrix k = random_matrix(3, 1, 16), v = random_matrix(4, 1, 16);
  k(0, 0) = 1000.0f;
  k(0, 1) = -6.0e4f;
  k(0, 2) = 448.0f;
  v(0, 0) = 6.0e4f;
  SequenceResult r = quantize_sequence(*make_method("fp8_e4m3"), k, v);
  EXPECT_EQ(r.k_hat(0, 0), 448.0f);
  EXPECT_EQ(r.k_hat(0, 1), -448.0f);
  EXPECT_EQ(r.k_hat(0, 2), 448.0f);
  EXPECT_EQ(r.v_hat(0, 0), 448.0f);
  SequenceResult r5 = quantize_sequence(*make_method("fp8_e5m2"), k, v);
  EXPECT_EQ(r5.v_hat(0, 0), 57344.0f);
  EXPECT_EQ(r5.k_hat(0, 0), 1024.0f);  // 1000 -> nearest e5m2 (step 128 in [512, 1024))
}

TEST(Fp8, StoredBytesAreTheFp8OfXOverScale) {
  Matrix k = random_matrix(11, 3, 32, 3.0), v = random_matrix(12, 3, 32, 3.0);
  SequenceResult r = quantize_sequence(*make_method("fp8:format=e4m3,scale=0.25"), k, v);
  ASSERT_EQ(r.k_chunks.size(), 3u);
  for (int t = 0; t < 3; ++t) {
    const Field* f = r.k_chunks[t].find("k_fp8");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(f->bytes.size(), 32u);
    for (int c = 0; c < 32; ++c) {
      const float x = round_to_half(k(t, c));
      EXPECT_EQ(f->bytes[c], float_to_fp8_bits(x / 0.25f, Fp8Format::kE4M3));
      EXPECT_EQ(r.k_hat(t, c), fp8_bits_to_float(f->bytes[c], Fp8Format::kE4M3) * 0.25f);
    }
  }
}

TEST(Fp8, CalibratedScaleIsAmaxOver200And100FromFirstBlock) {
  const int t = 20, d = 64;
  Matrix k = random_matrix(21, t, d, 2.0), v = random_matrix(22, t, d, 0.5);
  k(3, 5) = 37.0f;  // key amax
  v(7, 9) = -9.0f;  // value amax
  SequenceResult r = quantize_sequence(*make_method("fp8:scale=calibrated"), k, v);
  // amax maps to 200 (K) / 100 (V) e4m3 units: 200 -> 192 and 100 -> 96 (ties to even)
  EXPECT_FLOAT_EQ(r.k_hat(3, 5), 192.0f * (37.0f / 200.0f));
  EXPECT_FLOAT_EQ(r.v_hat(7, 9), -96.0f * (9.0f / 100.0f));
  // Calibration happens once: a later block far above the first amax saturates at 448 * scale.
  auto cache = make_method("fp8:scale=calibrated")->make_cache(d);
  cache->append(k.data(), v.data(), t);
  Matrix big = Matrix::Constant(1, d, 1000.0f);
  cache->append(big.data(), big.data(), 1);
  EXPECT_FLOAT_EQ(cache->keys()(t, 0), 448.0f * (37.0f / 200.0f));
  EXPECT_FLOAT_EQ(cache->values()(t, 0), 448.0f * (9.0f / 100.0f));
}

TEST(Fp8, StreamingEqualsBlockAppend) {
  auto m = make_method("fp8_e4m3");
  const int t = 17, d = 32;
  Matrix k = random_matrix(31, t, d), v = random_matrix(32, t, d);
  SequenceResult block = quantize_sequence(*m, k, v);
  auto cache = m->make_cache(d);
  for (int i = 0; i < t; ++i) cache->append(k.row(i).data(), v.row(i).data(), 1);
  EXPECT_EQ(Matrix(cache->keys()), block.k_hat);
  EXPECT_EQ(Matrix(cache->values()), block.v_hat);
  EXPECT_EQ(cache->stored_bytes(), block.stored_bytes);
}

TEST(Fp8, DegenerateInputsStayFinite) {
  const int t = 9, d = 32;
  for (const char* name : {"fp8_e4m3", "fp8_e5m2", "fp8:scale=calibrated"}) {
    auto m = make_method(name);
    Matrix zero = Matrix::Zero(t, d), constant = Matrix::Constant(t, d, 3.5f);
    Matrix outlier = random_matrix(41, t, d);
    outlier(0, 0) = 6.0e4f;
    Matrix sub = random_matrix(42, t, d, 1e-6);
    for (const Matrix* x : {&zero, &constant, &outlier, &sub}) {
      SequenceResult r = quantize_sequence(*m, *x, *x);
      EXPECT_TRUE(all_finite(r.k_hat) && all_finite(r.v_hat)) << name;
    }
    SequenceResult rz = quantize_sequence(*m, zero, zero);
    EXPECT_TRUE(rz.k_hat.isZero(0) && rz.v_hat.isZero(0)) << name;
  }
}

TEST(Fp8, RegistryNamesSpecsAndErrors) {
  for (const char* name : {"fp8_e4m3", "fp8_e5m2"}) {
    auto m = make_method(name);
    EXPECT_EQ(m->name(), name);
    EXPECT_EQ(m->family(), "fp8");
    EXPECT_EQ(make_method(m->spec())->spec(), m->spec());
  }
  auto c = make_method("fp8:scale=calibrated,granularity=head,format=e5m2");
  EXPECT_EQ(c->spec(), "fp8:format=e5m2,scale=calibrated,granularity=head");
  EXPECT_EQ(make_method(c->name())->spec(), c->spec());
  EXPECT_EQ(make_method("fp8:scale=0.125")->spec(),
            "fp8:format=e4m3,scale=0.125,granularity=tensor");
  try {
    make_method("fp8:fromat=e4m3");
    FAIL() << "unknown key accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("fromat"), std::string::npos) << msg;
    EXPECT_NE(msg.find("format"), std::string::npos) << msg;
    EXPECT_NE(msg.find("granularity"), std::string::npos) << msg;
  }
  EXPECT_THROW(make_method("fp8:format=e3m4"), Error);
  EXPECT_THROW(make_method("fp8:scale=-1"), Error);
  EXPECT_THROW(make_method("fp8:granularity=channel"), Error);
}

}  // namespace
}  // namespace kvarn
