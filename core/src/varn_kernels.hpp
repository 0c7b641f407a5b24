// Internal: the element-wise passes of variance_normalize in two builds of the same source
// (varn_kernels.inc). Both return the same bits. `fast`: the dividends and divisors are in the
// range where the FMA build may divide without the divider (the baseline ignores it).
#ifndef KVARN_CORE_SRC_VARN_KERNELS_HPP_
#define KVARN_CORE_SRC_VARN_KERNELS_HPP_

namespace kvarn {

struct VarnKernels {
  // a = src / by_col; row_std = canonical std of each row of a / by_row.
  void (*divide_cols_and_row_stds)(const float* src, int rows, int cols, const float* by_col,
                                   const float* by_row, float* a, float* row_std, bool fast);
  // cur = a / by_row; the canonical stds of cur's rows and columns.
  void (*divide_and_stats)(const float* a, int rows, int cols, const float* by_row, float* cur,
                           float* row_std, float* col_std, bool fast);
  // out = (src / by_col) / by_row.
  void (*divide_cols_rows)(const float* src, int rows, int cols, const float* by_col,
                           const float* by_row, float* out, bool fast);
};

namespace varn_baseline {
const VarnKernels& kernels();
}  // namespace varn_baseline

namespace varn_fma {
bool built();  // false where the compiler or the architecture cannot build it
const VarnKernels& kernels();
}  // namespace varn_fma

}  // namespace kvarn

#endif  // KVARN_CORE_SRC_VARN_KERNELS_HPP_
