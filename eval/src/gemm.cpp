#include "kvarn/eval/gemm.hpp"

#include <Eigen/Core>

#define KVARN_GEMM_SUFFIX(name) name##_baseline
#include "gemm_kernels.inc"

namespace kvarn::gemm {
namespace {

bool cpu_has_avx2_fma() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

}  // namespace

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
