// Lloyd-Max (1-D k-means on a density) scalar codebooks for TurboQuant.
//
//   lloyd_max_vllm_gaussian: vLLM's solver (turboquant/centroids.py) re-done in double: N(0, 1/d),
//     init at the cell centres of a uniform grid on +-3.5 sigma, outer edges +-10.5 sigma,
//     trapezoid rule with 200 steps per cell, <= 200 iterations, stop (keeping the previous
//     iterate, as vLLM does) when max |delta c| < 1e-10; the table is then cast to fp32.
//   lloyd_max_gaussian: the exact optimum for N(0, sigma^2) from closed-form cell moments.
//   lloyd_max_sphere: the exact coordinate law of a uniform unit vector in R^d (TurboQuant paper,
//     Lemma 1): f(x) ~ (1 - x^2)^((d-3)/2) on [-1, 1], integrated numerically (composite Simpson).
#ifndef KVARN_CORE_LLOYD_MAX_HPP_
#define KVARN_CORE_LLOYD_MAX_HPP_

#include <vector>

namespace kvarn {

struct LloydMaxResult {
  std::vector<double> centroids;   // ascending, 2^bits
  std::vector<double> boundaries;  // midpoints of neighbouring centroids, 2^bits - 1
  int iterations = 0;
};

LloydMaxResult lloyd_max_vllm_gaussian(int dim, int bits);
LloydMaxResult lloyd_max_gaussian(int bits, double sigma = 1.0);
LloydMaxResult lloyd_max_sphere(int dim, int bits);

// Mean squared error of the nearest-centroid quantizer (centroids ascending).
double gaussian_quantizer_mse(const std::vector<double>& centroids, double sigma = 1.0);
double sphere_quantizer_mse(int dim, const std::vector<double>& centroids);

// An fp32 table as a kernel holds it: centroids and midpoints (ties go to the upper bucket).
struct ScalarCodebook {
  int bits = 0;
  std::vector<float> centroids;  // 2^bits
  std::vector<float> midpoints;  // 2^bits - 1
  // Index of y: the number of midpoints <= y (vLLM's binary search, `y >= mid` goes up).
  int index(float y) const {
    int lo = 0, hi = static_cast<int>(midpoints.size());
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (y >= midpoints[mid]) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  }
};

ScalarCodebook to_codebook(const LloydMaxResult& r, int bits);

// Cached codebooks (thread-safe): vLLM TurboQuant keys and the TurboQuant paper's Beta law.
const ScalarCodebook& vllm_turboquant_codebook(int dim, int bits);
const ScalarCodebook& sphere_codebook(int dim, int bits);

}  // namespace kvarn

#endif  // KVARN_CORE_LLOYD_MAX_HPP_
