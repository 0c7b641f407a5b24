#include "kvarn/eval/gemm.hpp"

#include <Eigen/Core>

#include "kvarn/core/cpu.hpp"

#define KVARN_GEMM_SUFFIX(name) name##_baseline
#include "gemm_kernels.inc"

namespace kvarn::gemm {

bool uses_avx2() {
  static const bool avx2 = avx2_built() && cpu_has_avx2_fma();
  return avx2;
}

void scaled_abt(View a, View b, double scale, double* out) {
  if (uses_avx2()) {
    scaled_abt_avx2(a, b, scale, out);
  } else {
    scaled_abt_baseline(a, b, scale, out);
  }
}

void ab(View a, View b, double* out) {
  if (uses_avx2()) {
    ab_avx2(a, b, out);
  } else {
    ab_baseline(a, b, out);
  }
}

}  // namespace kvarn::gemm
