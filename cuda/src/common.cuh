// Shared CUDA plumbing: error reporting, dispatch macros (runtime value -> template constant),
// small device helpers (cp.async, mma / ldmatrix / movmatrix, code unpacking).
#ifndef KVARN_CUDA_COMMON_CUH_
#define KVARN_CUDA_COMMON_CUH_

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kvarn/cuda/error.hpp"

// DISPATCH_* turn a runtime value into a constexpr named NAME inside the body (a lambda-free
// switch; unsupported values throw kvarn::Error through kvarn::cuda::fail_unsupported).
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

namespace kvarn::cuda {

// Asynchronous 16-byte global -> shared copy (sm_80+); valid == false zero-fills the 16 bytes
// without reading global memory.
// The logical blocks [j_begin, j_end) of sequence blockIdx.z that split blockIdx.x of a paged
// decode covers (splits of equal block counts), never past max_blocks (the block-table row
// length) whatever seq_lens says, and the sequence's block-table row.
struct SplitBlocks {
  int len, j_begin, j_end;
  const int* table;
};
// (split, b: blockIdx.x and .z, or the warp's own where a CTA's warps work several)
__device__ __forceinline__ SplitBlocks split_blocks(const int* seq_lens, const int* block_table,
                                                    int max_blocks, int block_size, int num_splits,
                                                    int split, int b) {
  SplitBlocks r;
  r.len = seq_lens[b];
  const int nb = min((r.len + block_size - 1) / block_size, max_blocks);
  const int bps = (nb + num_splits - 1) / num_splits;
  r.j_begin = split * bps;
  r.j_end = min(nb, r.j_begin + bps);
  r.table = block_table + static_cast<long long>(b) * max_blocks;
  return r;
}
__device__ __forceinline__ SplitBlocks split_blocks(const int* seq_lens, const int* block_table,
                                                    int max_blocks, int block_size,
                                                    int num_splits) {
  return split_blocks(seq_lens, block_table, max_blocks, block_size, num_splits, blockIdx.x,
                      blockIdx.z);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid = true) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
// The same with the 128-byte L2 prefetch hint: DRAM is read a whole 128-byte line at a time for
// the 16-byte requests (H200, FP16 decode rows: 2-3 % faster at batch 8-32, docs/PERFORMANCE.md).
__device__ __forceinline__ void cp_async16_l2_128(void* smem, const void* gmem, bool valid = true) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// ---- bulk copy engine (sm_90): one instruction copies a whole 16-byte-aligned region into
// shared memory and completes on an mbarrier (transaction count = bytes) ----
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// Initialize an mbarrier expecting `count` arrivals; fence so the copy engine sees it.
__device__ __forceinline__ void mbar_init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of transactions for the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
// bytes (multiple of 16; both addresses 16-byte aligned) global -> shared, completing on bar.
__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* gmem, unsigned bytes,
                                              std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem_addr(smem)),
      "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
// Waits until the phase of parity `parity` of bar has completed. kCluster: acquire at cluster
// scope, for bytes that other CTAs of the cluster stored with st.async (their completion is a
// release at cluster scope); else the default CTA scope (the bulk copies).
template <bool kCluster = false>
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, unsigned parity) {
  unsigned done = 0;
  do {
    if constexpr (kCluster) {
      asm volatile(
          "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], "
          "%2;\n selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(smem_addr(bar)), "r"(parity)
          : "memory");
    } else {
      asm volatile(
          "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
          " selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(smem_addr(bar)), "r"(parity)
          : "memory");
    }
  } while (!done);
}

// ---- warp-level tensor-core helpers (sm_80+, movmatrix sm_75+) ----
// d += a * b, m16n8k16, fp16 inputs, fp32 accumulators. Fragment ownership (lane = 4 g + c):
//   a[0] (row g, k 2c..2c+1)  a[1] (row g+8, k 2c..)  a[2] (row g, k 2c+8..)  a[3] (row g+8, k 2c+8..)
//   b[0] (k 2c..2c+1, col g)  b[1] (k 2c+8.., col g)
//   d[0], d[1] (row g, cols 2c, 2c+1)  d[2], d[3] (row g+8, cols 2c, 2c+1)
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4],
                                          const std::uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// d = a * b + cin (the accumulator chain starts at cin instead of 0).
__device__ __forceinline__ void mma_16816_c(float (&d)[4], const std::uint32_t (&a)[4],
                                            const std::uint32_t (&b)[2], const float (&cin)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(cin[0]), "f"(cin[1]),
        "f"(cin[2]), "f"(cin[3]));
}
// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i; r[i] holds
// (row g, elements 2c, 2c+1) of matrix i.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
// Transpose of an 8x8 b16 matrix held one half2 per lane (row g, cols 2c, 2c+1).
__device__ __forceinline__ std::uint32_t movmatrix_trans(std::uint32_t x) {
  std::uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}
// The bits of a half2 as the 32-bit register the mma fragments use, and back.
__device__ __forceinline__ std::uint32_t half2_bits(__half2 h) {
  return *reinterpret_cast<const std::uint32_t*>(&h);
}
__device__ __forceinline__ __half2 as_half2(std::uint32_t x) {
  return *reinterpret_cast<const __half2*>(&x);
}
__device__ __forceinline__ std::uint32_t pack_half2(float lo, float hi) {
  return half2_bits(__floats2half2_rn(lo, hi));
}
__device__ __forceinline__ float2 unpack_half2(std::uint32_t x) {
  return __half22float2(as_half2(x));
}
// Two e4m3 bytes (low 16 bits of x) -> half2, exact.
__device__ __forceinline__ std::uint32_t e4m3x2_to_half2(std::uint32_t x) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x & 0xffffu), __NV_E4M3);
  return static_cast<std::uint32_t>(h.x) | (static_cast<std::uint32_t>(h.y) << 16);
}
// Unnormalized FWHT of a query held as mma B-fragment registers qf[KS][4] across a warp: a
// channel index is made of the bits e0 (element of a pair), c (lane column; 2 bits, exchanged by
// shuffles), e1 (pair 0 or 1) and s (k-step); butterflies on distinct bits commute, so each bit is
// done where it lives. Lanes with the same c hold the same channels of another head.
template <int KS>
__device__ __forceinline__ void fwht_fragments(float (&qf)[KS][4], int c) {
#pragma unroll
  for (int s = 0; s < KS; ++s)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const float u = qf[s][e], w = qf[s][e + 1];
      qf[s][e] = u + w;
      qf[s][e + 1] = u - w;
    }
#pragma unroll
  for (int bit = 1; bit <= 2; bit <<= 1) {
    const bool upper = (c & bit) != 0;
#pragma unroll
    for (int s = 0; s < KS; ++s)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float w = __shfl_xor_sync(0xffffffffu, qf[s][e], bit);
        qf[s][e] = upper ? w - qf[s][e] : qf[s][e] + w;
      }
  }
#pragma unroll
  for (int s = 0; s < KS; ++s)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float u = qf[s][e], w = qf[s][e + 2];
      qf[s][e] = u + w;
      qf[s][e + 2] = u - w;
    }
#pragma unroll
  for (int hs = 1; hs < KS; hs <<= 1)
#pragma unroll
    for (int s = 0; s < KS; ++s)
      if ((s & hs) == 0)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float u = qf[s][e], w = qf[s + hs][e];
          qf[s][e] = u + w;
          qf[s + hs][e] = u - w;
        }
}

// 2^x by the SFU alone (ex2.approx.ftz): exp2f adds a denormal range fix-up (setp, 2 fmul, sel)
// around the same instruction; softmax weights below 2^-126 may flush to zero.
__device__ __forceinline__ float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

// 1 / x by the SFU alone (rcp.approx.ftz, within 1 ulp): for scale normalizations that are
// multiplied back (x (1 / x) = 1 within 1e-7), where the IEEE division's fix-up path is waste.
__device__ __forceinline__ float fast_rcp(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

// Field kField of kBits-bit codes in both halves of x as fp16 subnormals: c 2^(kField kBits)
// 2^-24, exact while c 2^(kField kBits) < 1024 (one and; the tensor cores take fp16 subnormals
// at their value). The caller scales the products by 2^(24 - kField kBits).
template <int kBits, int kField>
__device__ __forceinline__ std::uint32_t codes_sub(std::uint32_t x) {
  static_assert((((1 << kBits) - 1) << (kField * kBits)) < 1024, "a subnormal's 10 mantissa bits");
  constexpr std::uint32_t kMask = ((1u << kBits) - 1u) << (kField * kBits);
  return x & (kMask | (kMask << 16));
}
// codes_sub of field i % kPack of a byte holding kPack fields: i is a constant once the caller's
// loop is unrolled, so this folds to the one lop3 of that field.
template <int kBits, int kPack>
__device__ __forceinline__ std::uint32_t codes_sub_at(std::uint32_t x, int i) {
  static_assert(kPack >= 1 && kPack <= 4, "at most four fields per byte");
  const int f = i % kPack;
  if (f == 0) return codes_sub<kBits, 0>(x);
  if (f == 1) return codes_sub<kBits, (kPack > 1 ? 1 : 0)>(x);
  if (f == 2) return codes_sub<kBits, (kPack > 2 ? 2 : 0)>(x);
  return codes_sub<kBits, (kPack > 3 ? 3 : 0)>(x);
}

// kBytes (1, 2, 4, 8, 16 or 32; aligned) from shared memory into 32-bit words.
template <int kBytes>
__device__ __forceinline__ void lds_bytes(const unsigned char* p,
                                          std::uint32_t (&w)[(kBytes + 3) / 4]) {
  if constexpr (kBytes == 1) {
    w[0] = *p;
  } else if constexpr (kBytes == 2) {
    w[0] = *reinterpret_cast<const unsigned short*>(p);
  } else if constexpr (kBytes == 4) {
    w[0] = *reinterpret_cast<const std::uint32_t*>(p);
  } else if constexpr (kBytes == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x;
    w[1] = v.y;
  } else {
    static_assert(kBytes % 16 == 0, "lds_bytes");
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i];
      w[4 * i] = v.x;
      w[4 * i + 1] = v.y;
      w[4 * i + 2] = v.z;
      w[4 * i + 3] = v.w;
    }
  }
}

// Programmatic dependent launch (sm_90): the dependent grid may start once every CTA of this
// grid called launch_dependents (or exited); it waits for the full results in grid_dep_wait.
__device__ __forceinline__ void grid_dep_launch() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void grid_dep_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
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
