// Shared CUDA plumbing: error reporting, dispatch macros (runtime value -> template constant),
// small device helpers (cp.async, code extraction).
#ifndef KVARN_CUDA_COMMON_CUH_
#define KVARN_CUDA_COMMON_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kvarn/cuda/error.hpp"

// DISPATCH_* turn a runtime value into a constexpr named NAME inside the body (a lambda-free
// switch; unsupported values report and abort through kvarn::cuda::fail_unsupported).
#define KVARN_DISPATCH_CASE(NAME, VAL, ...) \
  case VAL: {                               \
    constexpr int NAME = VAL;               \
    __VA_ARGS__                             \
  } break;

#define DISPATCH_HEAD_DIM(value, NAME, ...)                      \
  switch (value) {                                               \
    KVARN_DISPATCH_CASE(NAME, 64, __VA_ARGS__)                   \
    KVARN_DISPATCH_CASE(NAME, 128, __VA_ARGS__)                  \
    default:                                                     \
      ::kvarn::cuda::fail_unsupported("head_dim", value, __FILE__, __LINE__); \
  }

#define DISPATCH_GROUP_STORE(value, NAME, ...)                   \
  switch (value) {                                               \
    KVARN_DISPATCH_CASE(NAME, 32, __VA_ARGS__)                   \
    KVARN_DISPATCH_CASE(NAME, 64, __VA_ARGS__)                   \
    KVARN_DISPATCH_CASE(NAME, 128, __VA_ARGS__)                  \
    KVARN_DISPATCH_CASE(NAME, 256, __VA_ARGS__)                  \
    default:                                                     \
      ::kvarn::cuda::fail_unsupported("group", value, __FILE__, __LINE__); \
  }

#define DISPATCH_GROUP_DECODE(value, NAME, ...)                  \
  switch (value) {                                               \
    KVARN_DISPATCH_CASE(NAME, 32, __VA_ARGS__)                   \
    KVARN_DISPATCH_CASE(NAME, 64, __VA_ARGS__)                   \
    KVARN_DISPATCH_CASE(NAME, 128, __VA_ARGS__)                  \
    default:                                                     \
      ::kvarn::cuda::fail_unsupported("group/page", value, __FILE__, __LINE__); \
  }

// Query heads per KV head, padded up to 4 or 8 (padding heads are zero queries, discarded).
#define DISPATCH_QPK(value, NAME, ...)                           \
  if ((value) <= 4) {                                            \
    constexpr int NAME = 4;                                      \
    __VA_ARGS__                                                  \
  } else if ((value) <= 8) {                                     \
    constexpr int NAME = 8;                                      \
    __VA_ARGS__                                                  \
  } else {                                                       \
    ::kvarn::cuda::fail_unsupported("query heads per KV head", value, __FILE__, __LINE__); \
  }

namespace kvarn::cuda {

// Asynchronous 16- or 8-byte global -> shared copies (sm_80+).
template <int kBytes>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(gmem));
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Code j (0..7) of 8 consecutive codes packed upstream-style in the low 8/PACK bytes of w,
// returned as an exact float through the 2^23 magic: one shift, one lop3, one fadd, no branch.
template <int kBits, int kJ>
__device__ __forceinline__ float code_to_float(std::uint64_t w) {
  constexpr int kPack = 8 / kBits;
  constexpr int kShift = 8 * (kJ / kPack) + (kJ % kPack) * kBits;
  constexpr unsigned kMask = (1u << kBits) - 1u;
  const unsigned c = static_cast<unsigned>(w >> kShift) & kMask;
  return __uint_as_float(0x4B000000u | c) - 8388608.0f;
}

__device__ __forceinline__ float warp_max(float v, int width) {
  for (int o = width / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v, int width) {
  for (int o = width / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace kvarn::cuda

#endif  // KVARN_CUDA_COMMON_CUH_
