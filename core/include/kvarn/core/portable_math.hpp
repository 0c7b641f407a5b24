// Bit-reproducible scalar math shared by the CPU reference and the CUDA kernels.
//
// The store kernel must produce codes and scales bit-identical to the CPU reference, on any
// machine. libm and CUDA's logf/expf differ in the last ulp, so log/exp here are built from IEEE
// double +, *, / and exact bit manipulation only; with FMA contraction disabled on both sides
// (-ffp-contract=off, nvcc --fmad=false for the store kernel) every result is identical.
// Also here: fp16 and fp8 conversions (round to nearest even, as __float2half_rn and
// __nv_cvt_float_to_fp8(..., __NV_SATFINITE, ...)) and round-half-to-even.
#ifndef KVARN_CORE_PORTABLE_MATH_HPP_
#define KVARN_CORE_PORTABLE_MATH_HPP_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVARN_HD __host__ __device__ __forceinline__
#else
#define KVARN_HD inline
#include <cmath>
#endif

namespace kvarn {

KVARN_HD std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
KVARN_HD float bits_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}
KVARN_HD std::uint64_t double_bits(double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
KVARN_HD double bits_double(std::uint64_t u) {
  double x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// Round half to even (IEEE roundToIntegralTiesToEven; torch.round semantics).
// Below 2^23 adding and subtracting 1.5 * 2^23 rounds to an integer in the default (nearest-even)
// mode, exactly as rint; above it every float is already an integer. Branch-free on the CPU,
// where nearbyint would be a libm call without SSE4.1.
KVARN_HD float round_half_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  const float ax = x < 0 ? -x : x;
  if (!(ax < 8388608.0f)) return x;
  const float r = (ax + kMagic) - kMagic;
  return x < 0 ? -r : r;
#endif
}

KVARN_HD float sqrt_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

// Natural log of a positive, finite, normal-or-subnormal float, correctly rounded in all but
// vanishingly rare cases, and identical on host and device. x <= 0 is the caller's bug.
KVARN_HD float portable_log(float x) {
  constexpr double kLn2 = 0.69314718055994530942;
  constexpr double kSqrtHalf = 0.70710678118654752440;
  constexpr double k2p52 = 4503599627370496.0;  // 2^52
  double d = static_cast<double>(x);
  std::uint64_t u = double_bits(d);
  // Mantissa m in [1, 2); above sqrt(2) it is halved (its exponent bits lowered by one, exact)
  // and the exponent raised by one. The comparison is on the bits (positive doubles order as
  // their bits) and the unbiased exponent becomes an exact double through 2^52's exponent
  // (2^52 + bits), float subnormals being double normals: only 64-bit integer and double
  // operations, no branch, so loops over many scales vectorize with AVX2.
  const std::uint64_t mb = (u & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL;
  const std::uint64_t upper =  // signed compare (AVX2 has one), both below 2^63
      static_cast<std::int64_t>(mb) > static_cast<std::int64_t>(double_bits(2.0 * kSqrtHalf)) ? 1
                                                                                           : 0;
  double m = bits_double(mb - (upper << 52));
  double e = (bits_double((((u >> 52) & 0x7ff) + upper) | 0x4330000000000000ULL) - k2p52) - 1023.0;
  // log(m) = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.1716: 12 odd terms reach double precision.
  double s = (m - 1.0) / (m + 1.0);
  double s2 = s * s;
  double p = 1.0 / 25.0;
  p = p * s2 + 1.0 / 23.0;
  p = p * s2 + 1.0 / 21.0;
  p = p * s2 + 1.0 / 19.0;
  p = p * s2 + 1.0 / 17.0;
  p = p * s2 + 1.0 / 15.0;
  p = p * s2 + 1.0 / 13.0;
  p = p * s2 + 1.0 / 11.0;
  p = p * s2 + 1.0 / 9.0;
  p = p * s2 + 1.0 / 7.0;
  p = p * s2 + 1.0 / 5.0;
  p = p * s2 + 1.0 / 3.0;
  p = p * s2 + 1.0;
  double r = e * kLn2 + 2.0 * s * p;
  return static_cast<float>(r);
}

// e^x for |x| <= 80 (the normalization uses [-7, 10]); identical on host and device.
KVARN_HD float portable_exp(float x) {
  constexpr double kLn2Hi = 0.693147180369123816490;    // high bits of ln 2, exact k*kLn2Hi
  constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln 2 - kLn2Hi
  constexpr double kInvLn2 = 1.44269504088896338700;
  double d = static_cast<double>(x);
  double kf = d * kInvLn2;
  // round to nearest integer without libm: add/subtract 1.5 * 2^52. The sum's bits are
  // 0x4338000000000000 + k (two's complement k in the low mantissa bits).
  constexpr double kShift = 6755399441055744.0;
  const double shifted = kf + kShift;
  kf = shifted - kShift;
  double r = (d - kf * kLn2Hi) - kf * kLn2Lo;  // |r| <= 0.347
  double p = 1.0 / 6227020800.0;                // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // 2^k, exact: (k + 1023) << 52; the constant 0x4338... shifts out of the 64 bits.
  double scale = bits_double((double_bits(shifted) + 1023) << 52);
  return static_cast<float>(p * scale);
}

// ---------------------------------------------------------------------------------------------
// fp16 (IEEE binary16) conversions, round to nearest even with overflow to +-Inf.
KVARN_HD std::uint16_t float_to_half_bits(float f) {
  std::uint32_t x = float_bits(f);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520 -> Inf
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25 -> 0
    std::uint32_t exp = abs >> 23;
    std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    std::uint32_t shift = 126u - exp;  // 14..24
    std::uint32_t half = mant >> shift;
    std::uint32_t rem = mant & ((1u << shift) - 1u);
    std::uint32_t mid = 1u << (shift - 1u);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = ((abs - 0x38000000u) >> 13);  // rebias exponent 127 -> 15
  std::uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<std::uint16_t>(sign | half);
}

KVARN_HD float half_bits_to_float(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // subnormal: mant * 2^-24, exact in float
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Round a float to the nearest fp16 value and back (the "stored in fp16" step).
KVARN_HD float round_to_half(float f) { return half_bits_to_float(float_to_half_bits(f)); }

// ---------------------------------------------------------------------------------------------
// fp8 conversions (OCP E4M3FN: max 448, no Inf; E5M2: max 57344, IEEE-like) with saturation to
// the largest finite value, round to nearest even. NaN maps to the format's NaN.
enum class Fp8Format { kE4M3, kE5M2 };

KVARN_HD std::uint8_t float_to_fp8_bits(float f, Fp8Format fmt) {
  const int mbits = fmt == Fp8Format::kE4M3 ? 3 : 2;
  const int bias = fmt == Fp8Format::kE4M3 ? 7 : 15;
  const std::uint8_t max_code = fmt == Fp8Format::kE4M3 ? 0x7e : 0x7b;  // 448 / 57344
  const std::uint8_t nan_code = fmt == Fp8Format::kE4M3 ? 0x7f : 0x7e;
  std::uint32_t x = float_bits(f);
  std::uint8_t sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
  std::uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint8_t>(sign | nan_code);
  if (abs == 0) return sign;
  // Exact decomposition abs = mant24 * 2^(exp2 - 23) with mant24 in [2^23, 2^24) for normals.
  int fexp = static_cast<int>(abs >> 23);
  std::uint32_t mant = abs & 0x7fffffu;
  if (fexp == 0) {  // float subnormal: far below any fp8 subnormal
    return sign;
  }
  if (fexp == 0xff) return static_cast<std::uint8_t>(sign | max_code);  // Inf saturates
  mant |= 0x800000u;
  int e = fexp - 127;          // value = mant/2^23 * 2^e
  int min_normal_exp = 1 - bias;
  int shift;                   // bits of mant dropped
  std::uint32_t biased;
  if (e < min_normal_exp) {    // fp8 subnormal: value = m * 2^(min_normal_exp - mbits)
    shift = 23 - mbits + (min_normal_exp - e);
    biased = 0;
  } else {
    shift = 23 - mbits;
    biased = static_cast<std::uint32_t>(e + bias);
  }
  std::uint32_t q;
  if (shift >= 32) {
    q = 0;
  } else {
    q = mant >> shift;
    std::uint32_t rem = mant & ((1u << shift) - 1u);
    std::uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (q & 1u))) ++q;
  }
  std::uint32_t code;
  if (biased == 0) {
    code = q;  // may carry into the smallest normal: q == 2^mbits encodes exactly that
  } else {
    // q in [2^mbits, 2^(mbits+1)]; a carry bumps the exponent
    code = (biased << mbits) + (q - (1u << mbits));
  }
  if (code > max_code) code = max_code;
  return static_cast<std::uint8_t>(sign | code);
}

KVARN_HD float fp8_bits_to_float(std::uint8_t b, Fp8Format fmt) {
  const int mbits = fmt == Fp8Format::kE4M3 ? 3 : 2;
  const int bias = fmt == Fp8Format::kE4M3 ? 7 : 15;
  float sign = (b & 0x80u) ? -1.0f : 1.0f;
  std::uint32_t rest = b & 0x7fu;
  std::uint32_t exp = rest >> mbits;
  std::uint32_t mant = rest & ((1u << mbits) - 1u);
  if (fmt == Fp8Format::kE4M3 && rest == 0x7f) return bits_float(0x7fc00000u);
  if (fmt == Fp8Format::kE5M2 && exp == 31) {
    return mant ? bits_float(0x7fc00000u) : sign * bits_float(0x7f800000u);
  }
  float m;
  int e;
  if (exp == 0) {
    m = static_cast<float>(mant);
    e = 1 - bias - mbits;
  } else {
    m = static_cast<float>(mant | (1u << mbits));
    e = static_cast<int>(exp) - bias - mbits;
  }
  // 2^e exactly (e in [-17, 15])
  float p = bits_float(static_cast<std::uint32_t>(e + 127) << 23);
  return sign * m * p;
}

}  // namespace kvarn

#endif  // KVARN_CORE_PORTABLE_MATH_HPP_
