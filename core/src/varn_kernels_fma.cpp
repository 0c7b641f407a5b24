// The AVX2 + FMA build of variance_normalize's passes (varn_kernels.inc): divisions by the row
// and column scales without the divider, bit-identical to the baseline. This file alone is
// compiled with -mavx2 -mfma (core/CMakeLists.txt); it runs only where the CPU has both.
#include "varn_kernels.hpp"

#if defined(KVARN_VARN_FMA)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/reduce.hpp"

// The v8f helpers are always inlined, so the vector-argument ABI warning does not apply.
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpsabi"
#elif defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#define KVARN_VARN_NS varn_fma
#define KVARN_VARN_CLONES
#include "varn_kernels.inc"

namespace kvarn::varn_fma {
bool built() { return true; }
}  // namespace kvarn::varn_fma
#else
#include "kvarn/data/error.hpp"

namespace kvarn::varn_fma {
bool built() { return false; }
const VarnKernels& kernels() { fail("variance_normalize: built without AVX2 + FMA"); }
}  // namespace kvarn::varn_fma
#endif
