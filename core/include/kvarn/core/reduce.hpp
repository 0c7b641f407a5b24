// Canonical reductions: one fixed summation order, used by the CPU reference and the CUDA store
// kernel alike, so statistics are bit-identical on both.
//
// Order: eight interleaved partial sums p[i % 8] accumulated sequentially in index order, then the
// fixed tree ((p0+p4)+(p2+p6)) + ((p1+p5)+(p3+p7)). n must be a multiple of 8 (every supported
// head_dim and group is). std is the unbiased (N-1) two-pass estimator, as torch.std.
#ifndef KVARN_CORE_REDUCE_HPP_
#define KVARN_CORE_REDUCE_HPP_

#include "kvarn/core/portable_math.hpp"

namespace kvarn {

KVARN_HD float combine8(const float p[8]) {
  return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

KVARN_HD float canonical_sum(const float* x, int n) {
  float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < n; i += 8) {
    for (int j = 0; j < 8; ++j) p[j] += x[i + j];
  }
  return combine8(p);
}

// Unbiased standard deviation, two passes.
KVARN_HD float canonical_std(const float* x, int n) {
  float mean = canonical_sum(x, n) / static_cast<float>(n);
  float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      float d = x[i + j] - mean;
      p[j] += d * d;
    }
  }
  return sqrt_rn(combine8(p) / static_cast<float>(n - 1));
}

}  // namespace kvarn

#endif  // KVARN_CORE_REDUCE_HPP_
