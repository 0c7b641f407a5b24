// The AVX2 + FMA build of the attention metrics' products (gemm.hpp). This file alone is compiled
// with -mavx2 -mfma (eval/CMakeLists.txt). Eigen is renamed here so that its inline templates,
// instantiated with these flags, cannot be merged with the baseline instantiations of the same
// names elsewhere in the program (which would run AVX2 code on a CPU without it).
#include "kvarn/eval/gemm.hpp"

#if defined(KVARN_GEMM_AVX2)
#define Eigen kvarn_eigen_avx2
#include <Eigen/Core>
#define KVARN_GEMM_SUFFIX(name) name##_avx2
#include "gemm_kernels.inc"

namespace kvarn::gemm {
bool avx2_built() { return true; }
}  // namespace kvarn::gemm
#else
#include "kvarn/data/error.hpp"

namespace kvarn::gemm {
bool avx2_built() { return false; }
void scaled_abt_avx2(View, View, double, double*) { fail("gemm: built without AVX2"); }
void ab_avx2(View, View, double*) { fail("gemm: built without AVX2"); }
}  // namespace kvarn::gemm
#endif
