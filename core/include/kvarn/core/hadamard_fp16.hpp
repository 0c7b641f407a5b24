// Exact arithmetic of the published fp16 Hadamard rotation (KVarN's default), shared by the CPU
// reference and the CUDA store kernel.
//
// Upstream multiplies fp16 rows by a dense fp16 matrix with entries +-c, c = fp16(1/sqrt(D)), in
// an fp16 GEMM (fp32 accumulation in an unspecified order) and stores fp16. The order-independent
// representative computed here is y_i = fp16_RNE(c * S_i), S_i = sum_j h_ij x_j, h = +-1
// Sylvester, x_j the fp16 inputs, with S_i and c * S_i exact:
//   - every fp16 value is an integer multiple of 2^-24 below 2^40 * 2^-24, so x_j * 2^24 is an
//     int64 and S_i * 2^24, a sum of D <= 2048 of them, is exact in int64 (< 2^51);
//   - c = m_c * 2^e_c with an 11-bit integer m_c, so c * S_i * 2^24 = m_c * (S_i * 2^24) < 2^62
//     is an exact int64 product;
//   - it is rounded once to fp32 with round-to-odd (sticky last bit), then to fp16 with round to
//     nearest even: rounding to odd at p >= q + 2 bits followed by RNE at q bits equals RNE of the
//     exact value (fp32 p = 24, fp16 q <= 11), so the fp16 result is the correctly rounded value
//     of the exact product, while the fp32 value is within one fp32 ulp of it.
#ifndef KVARN_CORE_HADAMARD_FP16_HPP_
#define KVARN_CORE_HADAMARD_FP16_HPP_

#include <cstdint>

#include "kvarn/core/portable_math.hpp"

namespace kvarn {

// Largest head_dim of the exact fp16 rotation (keeps m_c * S * 2^24 below 2^62).
constexpr int kHadamardFp16MaxDim = 2048;

// fp16 value * 2^24 as an integer (exact for every finite fp16 value, subnormals included).
KVARN_HD std::int64_t half_to_fixed24(std::uint16_t h) {
  const std::int64_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const std::int64_t mag = exp == 0 ? mant : (mant | 0x400) << (exp - 1);
  return (h & 0x8000u) ? -mag : mag;
}

// m * 2^e for the fp16 value with bits h (normal, positive): the rotation scale c.
struct Fp16Scale {
  std::int64_t m = 0;
  int e = 0;
};
KVARN_HD Fp16Scale fp16_scale(std::uint16_t h) {
  Fp16Scale s;
  s.m = (h & 0x3ff) | 0x400;
  s.e = static_cast<int>((h >> 10) & 0x1f) - 25;
  return s;
}

KVARN_HD int bit_length64(std::uint64_t a) {
#if defined(__CUDA_ARCH__)
  return 64 - __clzll(static_cast<long long>(a));
#else
  return a == 0 ? 0 : 64 - __builtin_clzll(a);
#endif
}

// p * 2^e rounded to fp32 with round-to-odd; |p| < 2^62 and p * 2^e within the fp32 normal range
// (or zero). Zero gives +0.
KVARN_HD float fixed_to_float_odd(std::int64_t p, int e) {
  if (p == 0) return 0.0f;
  std::uint64_t a = static_cast<std::uint64_t>(p < 0 ? -p : p);
  const int n = bit_length64(a);
  if (n > 24) {
    const int sh = n - 24;
    const bool sticky = (a & ((std::uint64_t{1} << sh) - 1)) != 0;
    a = (a >> sh) | (sticky ? 1u : 0u);
    e += sh;
  }
  // a < 2^24 converts exactly; 2^e is exact and the product is a normal float.
  const float m = static_cast<float>(static_cast<std::uint32_t>(a));
  const float v = m * bits_float(static_cast<std::uint32_t>(e + 127) << 23);
  return p < 0 ? -v : v;
}

// c * S as the fp32 round-to-odd value (fp16 rounding of it is the correctly rounded fp16),
// for s24 = S * 2^24.
KVARN_HD float hadamard_fp16_scale(std::int64_t s24, Fp16Scale c) {
  return fixed_to_float_odd(s24 * c.m, c.e - 24);
}

}  // namespace kvarn

#endif  // KVARN_CORE_HADAMARD_FP16_HPP_
