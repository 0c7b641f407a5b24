// The baseline build of variance_normalize's passes (varn_kernels.inc): true divisions, with an
// AVX2 clone chosen at load time.
#include "varn_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/reduce.hpp"
#include "simd.hpp"

// The v8f helpers are always inlined, so the vector-argument ABI warning does not apply.
#if defined(__clang__)
#pragma clang diagnostic ignored "-Wpsabi"
#elif defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#define KVARN_VARN_NS varn_baseline
#define KVARN_VARN_CLONES KVARN_SIMD_CLONES
#include "varn_kernels.inc"
