// The two double products of the attention metrics on row-major blocks, dispatched once per
// process: an AVX2 + FMA build of Eigen's GEMM (src/gemm_avx2.cpp) where the CPU has both, else the
// baseline build (src/gemm.cpp). The two differ at rounding level (fused multiply-adds, wider
// packets); on one machine every call takes the same path, so results do not depend on the
// thread count or the call order.
#ifndef KVARN_EVAL_GEMM_HPP_
#define KVARN_EVAL_GEMM_HPP_

namespace kvarn::gemm {

// A row-major view: rows x cols, rows `stride` apart.
struct View {
  const double* data;
  int rows, cols, stride;
};

// out (a.rows x b.rows, row-major, contiguous) = scale * a * b^T.
void scaled_abt(View a, View b, double scale, double* out);
// out (a.rows x b.cols, row-major, contiguous) = a * b.
void ab(View a, View b, double* out);

// Whether the AVX2 + FMA build is the one in use (tests; the run provenance's attention_gemm).
bool uses_avx2();

// Each build on its own (tests compare them).
void scaled_abt_baseline(View a, View b, double scale, double* out);
void ab_baseline(View a, View b, double* out);
bool avx2_built();  // false where the compiler or the architecture cannot build it
void scaled_abt_avx2(View a, View b, double scale, double* out);
void ab_avx2(View a, View b, double* out);

}  // namespace kvarn::gemm

#endif  // KVARN_EVAL_GEMM_HPP_
