// The attention metrics' double products (kvarn/eval/gemm.hpp): the baseline build computes what
// Eigen's expressions on blocks compute, bit for bit; the AVX2 + FMA build agrees with it to
// rounding.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <random>

#include "kvarn/eval/gemm.hpp"

namespace kvarn {
namespace {

using RowMajorD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// fp16-valued entries, as the metrics see them (K, V and Q are fp16 tensors).
RowMajorD fp16_values(int rows, int cols, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.f, 1.f);
  RowMajorD m(rows, cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j)
      m(i, j) = std::ldexp(std::nearbyint(std::ldexp(n(rng), 10)), -10);
  return m;
}

gemm::View view(const RowMajorD& m, int r0, int rows) {
  return {m.data() + static_cast<std::ptrdiff_t>(r0) * m.cols(), rows, static_cast<int>(m.cols()),
          static_cast<int>(m.cols())};
}

struct Shapes {
  RowMajorD q = fp16_values(200, 128, 1), k = fp16_values(300, 128, 2), p = fp16_values(64, 300, 3);
  RowMajorD v = fp16_values(300, 128, 4);
};

TEST(AttentionGemm, BaselineIsTheBlockExpressionBitForBit) {
  const Shapes s;
  const double scale = 1.0 / std::sqrt(128.0);
  const int i0 = 70, b = 64, n = 257;
  RowMajorD want = (s.q.middleRows(i0, b) * s.k.topRows(n).transpose()) * scale;
  RowMajorD got(b, n);
  gemm::scaled_abt_baseline(view(s.q, i0, b), view(s.k, 0, n), scale, got.data());
  EXPECT_TRUE((got.array() == want.array()).all());
  RowMajorD want_o = s.p.leftCols(n) * s.v.topRows(n);
  RowMajorD p = s.p.leftCols(n), got_o(b, 128);
  gemm::ab_baseline(view(p, 0, b), view(s.v, 0, n), got_o.data());
  EXPECT_TRUE((got_o.array() == want_o.array()).all());
}

TEST(AttentionGemm, Avx2BuildAgreesToRounding) {
  if (!gemm::avx2_built() || !gemm::uses_avx2()) {
    GTEST_SKIP() << "the AVX2 + FMA build is not in use on this machine (no AVX2/FMA CPU or "
                    "compiler): only the baseline is checked";
  }
  const Shapes s;
  const double scale = 1.0 / std::sqrt(128.0);
  for (int n : {1, 31, 300}) {
    RowMajorD base(64, n), fast(64, n);
    gemm::scaled_abt_baseline(view(s.q, 5, 64), view(s.k, 0, n), scale, base.data());
    gemm::scaled_abt_avx2(view(s.q, 5, 64), view(s.k, 0, n), scale, fast.data());
    // 128 products of fp16 values are exact in double; only the summation order and FMA differ.
    EXPECT_LE((fast - base).cwiseAbs().maxCoeff(), 1e-12 * (1 + base.cwiseAbs().maxCoeff())) << n;
    RowMajorD p = s.p.leftCols(n), ob(64, 128), of(64, 128);
    gemm::ab_baseline(view(p, 0, 64), view(s.v, 0, n), ob.data());
    gemm::ab_avx2(view(p, 0, 64), view(s.v, 0, n), of.data());
    EXPECT_LE((of - ob).cwiseAbs().maxCoeff(), 1e-12 * (1 + ob.cwiseAbs().maxCoeff())) << n;
  }
  // The dispatching entry points take the AVX2 build here.
  RowMajorD a(64, 300), b(64, 300);
  gemm::scaled_abt(view(s.q, 0, 64), view(s.k, 0, 300), 0.5, a.data());
  gemm::scaled_abt_avx2(view(s.q, 0, 64), view(s.k, 0, 300), 0.5, b.data());
  EXPECT_TRUE((a.array() == b.array()).all());
}

}  // namespace
}  // namespace kvarn
