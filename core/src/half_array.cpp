#include "kvarn/core/half_array.hpp"

#include <cstdint>
#include <cstring>

#include "kvarn/core/portable_math.hpp"
#include "simd.hpp"

namespace kvarn {

KVARN_SIMD_CLONES void round_to_half_inplace(float* x, std::size_t n) {
  // For |x| in [2^-14, 65520) rounding the float's mantissa to 10 bits (nearest even) is exactly
  // the fp16 value; carries into the exponent are correct. Below 2^-14 the fp16 values are the
  // multiples of 2^-24, and (|x| + 0.5f) - 0.5f rounds |x| to one, nearest even (the sum lies in
  // [0.5, 1), where the float spacing is 2^-24; the subtraction is exact). Only Inf, NaN and
  // values that overflow take the slow path.
  constexpr std::uint32_t kLo = 0x38800000u, kHi = 0x477ff000u;
  std::uint32_t any_slow = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, &x[i], 4);
    const std::uint32_t a = u & 0x7fffffffu;
    // Masks instead of selects keep the loop free of branches (it vectorizes).
    const std::uint32_t ok = 0u - static_cast<std::uint32_t>((a - kLo) < (kHi - kLo));
    const std::uint32_t small = 0u - static_cast<std::uint32_t>(a < kLo);
    const std::uint32_t r = (u + 0x0fffu + ((u >> 13) & 1u)) & 0xffffe000u;
    float fa;
    std::memcpy(&fa, &a, 4);
    const float rs = (fa + 0.5f) - 0.5f;
    std::uint32_t s;
    std::memcpy(&s, &rs, 4);
    s |= u & 0x80000000u;
    const std::uint32_t out = (r & ok) | (s & small) | (u & ~(ok | small));
    std::memcpy(&x[i], &out, 4);
    any_slow |= ~(ok | small) & 1u;
  }
  if (!any_slow) return;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t a = float_bits(x[i]) & 0x7fffffffu;
    if (a >= kHi) x[i] = round_to_half(x[i]);
  }
}

void transpose(const float* x, int rows, int cols, float* out) {
  constexpr int kB = 8;
  if (rows % kB == 0 && cols % kB == 0) {
    for (int r0 = 0; r0 < rows; r0 += kB)
      for (int c0 = 0; c0 < cols; c0 += kB)
        for (int r = 0; r < kB; ++r)
          for (int c = 0; c < kB; ++c)
            out[static_cast<std::size_t>(c0 + c) * rows + r0 + r] =
                x[static_cast<std::size_t>(r0 + r) * cols + c0 + c];
    return;
  }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      out[static_cast<std::size_t>(c) * rows + r] = x[static_cast<std::size_t>(r) * cols + c];
}

}  // namespace kvarn
