#include "kvarn/core/half_array.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kvarn/core/cpu.hpp"
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

namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVARN_TRANSPOSE_AVX2 1
// One 8x8 block per step: eight row loads, the classic unpack / shuffle / lane-permute network,
// eight column stores. Pure data movement, so the result is the scalar loop's, bit for bit.
__attribute__((target("avx2"))) void transpose_blocks_avx2(const float* x, int rows, int cols,
                                                           float* out) {
  for (int r0 = 0; r0 < rows; r0 += 8) {
    for (int c0 = 0; c0 < cols; c0 += 8) {
      __m256 r[8], t[8], u[8];
      for (int i = 0; i < 8; ++i)
        r[i] = _mm256_loadu_ps(x + static_cast<std::size_t>(r0 + i) * cols + c0);
      for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
      }
      for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
      }
      for (int i = 0; i < 4; ++i) {
        float* lo = out + static_cast<std::size_t>(c0 + i) * rows + r0;
        float* hi = out + static_cast<std::size_t>(c0 + i + 4) * rows + r0;
        _mm256_storeu_ps(lo, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps(hi, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
      }
    }
  }
}
#endif

void transpose_blocks(const float* x, int rows, int cols, float* out) {
  constexpr int kB = 8;
  for (int r0 = 0; r0 < rows; r0 += kB)
    for (int c0 = 0; c0 < cols; c0 += kB)
      for (int r = 0; r < kB; ++r)
        for (int c = 0; c < kB; ++c)
          out[static_cast<std::size_t>(c0 + c) * rows + r0 + r] =
              x[static_cast<std::size_t>(r0 + r) * cols + c0 + c];
}

}  // namespace

void transpose(const float* x, int rows, int cols, float* out) {
  if (rows % 8 == 0 && cols % 8 == 0) {
#ifdef KVARN_TRANSPOSE_AVX2
    static const bool avx2 = cpu_has_avx2();
    if (avx2) return transpose_blocks_avx2(x, rows, cols, out);
#endif
    return transpose_blocks(x, rows, cols, out);
  }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      out[static_cast<std::size_t>(c) * rows + r] = x[static_cast<std::size_t>(r) * cols + c];
}

}  // namespace kvarn
