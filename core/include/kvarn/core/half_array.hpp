// Rounds an array of floats to the nearest fp16 values in place (round_to_half of each element,
// bit-identical), with a vectorized path for the fp16 normal range.
#ifndef KVARN_CORE_HALF_ARRAY_HPP_
#define KVARN_CORE_HALF_ARRAY_HPP_

#include <cstddef>

namespace kvarn {

void round_to_half_inplace(float* x, std::size_t n);

// out[c][r] = x[r][c] for a rows x cols row-major matrix.
void transpose(const float* x, int rows, int cols, float* out);

}  // namespace kvarn

#endif  // KVARN_CORE_HALF_ARRAY_HPP_
