// Paged decode attention over a KVarN / FP16 / FP8 cache, split-K with a log-sum-exp combine.
//
// Cache (one layer):
//   block_table [batch, max_blocks] i32: physical block of logical block j of sequence b
//   seq_lens    [batch] i32
//   KVarN:  records [num_blocks, Hkv, record_bytes] u8, the exact kvarn_encode_record bytes
//           (K codes [D][G/PACK_K] channel-major, V codes [G][D/PACK_V] token-major + scales);
//           block_to_slot [num_blocks] i32: >= 0 -> the block lives in the fp16 pool (sink,
//           tail, not yet quantized): k_pool/v_pool [slots, Hkv, G, D] fp16, rotated frame.
//   FP16:   k_pool/v_pool [num_blocks, Hkv, P, D] fp16 (page P = kernel's G), not rotated.
//   FP8:    same with e4m3 bytes and per-KV-head float scales k_scale/v_scale [Hkv].
//   query [batch, Hq, D] fp16, output [batch, Hq, D] fp16 (original frame);
//   query head hq uses KV head hq / (Hq / Hkv).
// Workspace: o_part [batch, Hq, S, D] f32 (normalized by the split's l), lse [batch, Hq, S] f32
//   (log2 domain, -inf for an empty split).
//
// Split kernel: grid (S, Hkv, batch), 128 threads; one CTA serves all QP query heads of its
// KV head from one load of every tile. Split s covers logical blocks
//   [s * ceil(nb / S), (s + 1) * ceil(nb / S)) of its sequence, nb = ceil(len / G).
// Per block: (1) scores S[i][t] (KVarN record: thread per token, factorized
//   S = s_row_k[t] * (sum_d (q[i][d] s_col_k[d]) code[d][t] + sum_d q[i][d] zp_k[d]);
//   fp16 rows: 16-byte row loads, lanes split D, reduce-scatter over lanes);
// (2) online softmax per head (warp per head, exp2 domain, m/l in shared memory);
// (3) PV with thread (token group, 8 channels) accumulators in registers across blocks,
//   KVarN factorized as s_col_v[d] * (sum_t (p s_row_v[t]) code[t][d] + sum_t p zp_v[t]).
// Records are staged into shared memory with cp.async, double-buffered one block ahead.
// Never writes K/V anywhere: fp16 K/V are not materialized.
#ifndef KVARN_CUDA_DECODE_CUH_
#define KVARN_CUDA_DECODE_CUH_

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kvarn/cuda/common.cuh"

namespace kvarn::cuda {

enum class KvFormat : int { kKvarn = 0, kFp16 = 1, kFp8 = 2 };

constexpr int kDecodeThreads = 128;

struct DecodeArgs {
  const __half* q;
  const int* block_table;
  int max_blocks;
  const int* seq_lens;
  const std::uint8_t* records;
  long long record_bytes;
  const int* block_to_slot;
  const void* k_pool;
  const void* v_pool;
  const float* k_scale;
  const float* v_scale;
  int num_q_heads, num_kv_heads, qpk, num_splits;
  float qk_scale;   // softmax scale * log2(e)
  float rot_scale;  // 0: no rotation; else Hadamard 1/sqrt(D)
  int fp8_scales;
  int s_col_k, zp_k, s_row_k, v_codes, s_col_v, s_row_v, zp_v;  // record byte offsets
  float* o_part;
  float* lse;
};

template <int D, int G, int KB, int VB, int QP, KvFormat F>
struct DecodeTraits {
  static constexpr int kCols = D / 8;                  // 8-channel columns
  static constexpr int kTGroups = kDecodeThreads / kCols;
  static constexpr int kParts = kDecodeThreads / G;    // record K phase: threads per token
  static constexpr int kDPerPart = D / kParts;
  static constexpr int kPackK = 8 / KB, kPackV = 8 / VB;
  static constexpr int kRowBytesK = G / kPackK, kRowBytesV = D / kPackV;
  static constexpr int kWordV = 8 / kPackV;            // bytes of 8 V codes
  static_assert(kCols <= 32 && kDecodeThreads % kCols == 0, "head_dim");
  static_assert(kParts >= 1 && D % kParts == 0, "group");
  // shared memory (floats): q[QP][D], qs[D][QP], sc[kParts][QP][G], p[G][QP], stats
  static constexpr int kQ = 0, kQs = kQ + QP * D, kSc = kQs + D * QP, kP = kSc + kParts * QP * G;
  static constexpr int kM = kP + G * QP, kL = kM + QP, kAlpha = kL + QP, kPz = kAlpha + QP,
                       kQz = kPz + QP, kRed = kQz + QP, kFloats = kRed + 4 * QP;
  static constexpr int kFloatBytes = (kFloats * 4 + 15) / 16 * 16;
  static constexpr int kReduceBytes = kTGroups * QP * D * 4;
};

// ---- helpers ----
__device__ __forceinline__ float ld_scale(const std::uint8_t* p, int idx, int fp8) {
  if (fp8) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(p[idx]), __NV_E4M3);
    return __half2float(__half(h));
  }
  return __half2float(reinterpret_cast<const __half*>(p)[idx]);
}

// 8 consecutive fp16 (16 B) or e4m3 (8 B) values -> float
template <KvFormat F>
__device__ __forceinline__ void load8(const void* base, long long elem, float (&v)[8]) {
  if constexpr (F == KvFormat::kFp8) {
    const uint2 w = __ldg(reinterpret_cast<const uint2*>(static_cast<const std::uint8_t*>(base) + elem));
    const unsigned u[2] = {w.x, w.y};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>((u[k / 2] >> (16 * (k % 2))) & 0xffffu), __NV_E4M3);
      float2 f = __half22float2(__half2(h));
      v[2 * k] = f.x;
      v[2 * k + 1] = f.y;
    }
  } else {
    const uint4 w = __ldg(reinterpret_cast<const uint4*>(static_cast<const __half*>(base) + elem));
    const unsigned u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float2 f = __half22float2(*reinterpret_cast<const __half2*>(&u[k]));
      v[2 * k] = f.x;
      v[2 * k + 1] = f.y;
    }
  }
}

// Reduce-scatter of QP partial sums across kW adjacent lanes: returns the full sum of head
// *head in lanes whose low bits (below the remaining width) are zero (*writer).
template <int QP, int kW>
__device__ __forceinline__ float reduce_scatter(float (&v)[QP], int lane, int* head, bool* writer) {
  int h = 0;
  int n = QP;
  int off = kW / 2;
#pragma unroll
  for (int step = 0; step < 5; ++step) {
    if (n > 1 && off >= 1) {
      const bool upper = (lane & off) != 0;
#pragma unroll
      for (int k = 0; k < QP / 2; ++k) {
        if (k < n / 2) {
          const float send = upper ? v[k] : v[k + n / 2];
          const float keep = upper ? v[k + n / 2] : v[k];
          v[k] = keep + __shfl_xor_sync(0xffffffffu, send, off);
        }
      }
      if (upper) h += n / 2;
      n /= 2;
      off /= 2;
    }
  }
  float s = v[0];
  int rem = off;
  for (; off >= 1; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  *head = h;
  *writer = (lane & (2 * rem - 1)) == 0 || rem == 0;
  return s;
}

template <int D, int G, int KB, int VB, int QP, KvFormat F>
__global__ void __launch_bounds__(kDecodeThreads) paged_decode_kernel(DecodeArgs a) {
  using T = DecodeTraits<D, G, KB, VB, QP, F>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sf = reinterpret_cast<float*>(smem_raw);
  float* q_s = sf + T::kQ;
  float* qs_s = sf + T::kQs;
  float* sc_s = sf + T::kSc;
  float* p_s = sf + T::kP;
  float* m_s = sf + T::kM;
  float* l_s = sf + T::kL;
  float* alpha_s = sf + T::kAlpha;
  float* pz_s = sf + T::kPz;
  float* qz_s = sf + T::kQz;
  float* red_s = sf + T::kRed;
  unsigned char* rec_s = smem_raw + T::kFloatBytes;
  const long long rec_stride = (a.record_bytes + 15) / 16 * 16;

  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int len = a.seq_lens[b];
  const int nb = (len + G - 1) / G;
  const int bps = (nb + a.num_splits - 1) / a.num_splits;
  const int j_begin = split * bps;
  const int j_end = min(nb, j_begin + bps);
  const int* table = a.block_table + static_cast<long long>(b) * a.max_blocks;

  // ---- query: load, rotate (FWHT * rot_scale), scale into the exp2 domain ----
  for (int i = tid; i < QP * D; i += kDecodeThreads) {
    const int hi = i / D, d = i % D;
    q_s[i] = hi < a.qpk ? __half2float(a.q[(static_cast<long long>(b) * a.num_q_heads +
                                            h * a.qpk + hi) * D + d])
                        : 0.0f;
  }
  if (tid < QP) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
  }
  __syncthreads();
  if (a.rot_scale != 0.0f) {
    for (int hs = 1; hs < D; hs <<= 1) {
      for (int p = tid; p < QP * D / 2; p += kDecodeThreads) {
        const int row = p / (D / 2), qq = p % (D / 2);
        const int j = row * D + (qq / hs) * 2 * hs + qq % hs;
        const float u = q_s[j], w = q_s[j + hs];
        q_s[j] = u + w;
        q_s[j + hs] = u - w;
      }
      __syncthreads();
    }
  }
  {
    const float s = (a.rot_scale != 0.0f ? a.rot_scale : 1.0f) * a.qk_scale;
    for (int i = tid; i < QP * D; i += kDecodeThreads) q_s[i] *= s;
  }
  __syncthreads();

  const int col = tid % T::kCols, tg = tid / T::kCols;
  float acc[8][QP];
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int i = 0; i < QP; ++i) acc[j][i] = 0.0f;

  auto is_record = [&](int j, int* phys, int* slot) {
    *phys = table[j];
    if constexpr (F == KvFormat::kKvarn) {
      *slot = a.block_to_slot[*phys];
      return *slot < 0;
    } else {
      *slot = *phys;
      return false;
    }
  };
  auto prefetch = [&](int j) {
    if constexpr (F == KvFormat::kKvarn) {
      int phys, slot;
      if (j < j_end && is_record(j, &phys, &slot)) {
        const unsigned char* src =
            a.records + (static_cast<long long>(phys) * a.num_kv_heads + h) * a.record_bytes;
        unsigned char* dst = rec_s + (j & 1) * rec_stride;
        if ((a.record_bytes & 15) == 0) {
          for (long long o = tid * 16; o < a.record_bytes; o += kDecodeThreads * 16)
            cp_async<16>(dst + o, src + o);
        } else {
          for (long long o = tid * 8; o < a.record_bytes; o += kDecodeThreads * 8)
            cp_async<8>(dst + o, src + o);
        }
      }
    }
    cp_async_commit();
  };

  prefetch(j_begin);
  for (int j = j_begin; j < j_end; ++j) {
    prefetch(j + 1);
    cp_async_wait<1>();
    __syncthreads();
    int phys, slot;
    const bool record = is_record(j, &phys, &slot);
    const int n_valid = min(G, len - j * G);
    const unsigned char* rec = rec_s + (j & 1) * rec_stride;

    // ---------------- (1) scores ----------------
    if (record) {
      float qz[QP];
#pragma unroll
      for (int i = 0; i < QP; ++i) qz[i] = 0.0f;
      for (int d = tid; d < D; d += kDecodeThreads) {
        const float s = ld_scale(rec + a.s_col_k, d, a.fp8_scales);
        const float z = __half2float(reinterpret_cast<const __half*>(rec + a.zp_k)[d]);
#pragma unroll
        for (int i = 0; i < QP; ++i) {
          const float qv = q_s[i * D + d];
          qs_s[d * QP + i] = qv * s;
          qz[i] += qv * z;
        }
      }
#pragma unroll
      for (int i = 0; i < QP; ++i) {
        const float v = warp_sum(qz[i], 32);
        if (lane == 0) red_s[warp * QP + i] = v;
      }
      __syncthreads();
      if (tid < QP) qz_s[tid] = red_s[tid] + red_s[QP + tid] + red_s[2 * QP + tid] + red_s[3 * QP + tid];
      {
        const int t = tid % G, part = tid / G;
        const unsigned char* codes = rec + t / T::kPackK;
        const int shift = (t % T::kPackK) * KB;
        constexpr unsigned kMask = (1u << KB) - 1u;
        float s[QP];
#pragma unroll
        for (int i = 0; i < QP; ++i) s[i] = 0.0f;
        const int d0 = part * T::kDPerPart;
#pragma unroll 8
        for (int d = d0; d < d0 + T::kDPerPart; ++d) {
          const unsigned c = (static_cast<unsigned>(codes[d * T::kRowBytesK]) >> shift) & kMask;
          const float cf = __uint_as_float(0x4B000000u | c) - 8388608.0f;
          const float4* qv = reinterpret_cast<const float4*>(qs_s + d * QP);
#pragma unroll
          for (int i4 = 0; i4 < QP / 4; ++i4) {
            const float4 w = qv[i4];
            s[4 * i4 + 0] += w.x * cf;
            s[4 * i4 + 1] += w.y * cf;
            s[4 * i4 + 2] += w.z * cf;
            s[4 * i4 + 3] += w.w * cf;
          }
        }
#pragma unroll
        for (int i = 0; i < QP; ++i) sc_s[(part * QP + i) * G + t] = s[i];
      }
    } else {
      const void* kbase = a.k_pool;
      const long long base = ((static_cast<long long>(slot) * a.num_kv_heads + h) * G) * D;
      float qr[QP][8];
#pragma unroll
      for (int i = 0; i < QP; ++i)
#pragma unroll
        for (int k = 0; k < 8; ++k) qr[i][k] = q_s[i * D + col * 8 + k];
#pragma unroll 2
      for (int t = tg; t < G; t += T::kTGroups) {
        float kv[8];
        if (t < n_valid) {
          load8<F == KvFormat::kFp8 ? KvFormat::kFp8 : KvFormat::kFp16>(
              kbase, base + static_cast<long long>(t) * D + col * 8, kv);
        } else {
#pragma unroll
          for (int k = 0; k < 8; ++k) kv[k] = 0.0f;
        }
        float s[QP];
#pragma unroll
        for (int i = 0; i < QP; ++i) {
          s[i] = 0.0f;
#pragma unroll
          for (int k = 0; k < 8; ++k) s[i] += qr[i][k] * kv[k];
        }
        int head;
        bool writer;
        const float tot = reduce_scatter<QP, T::kCols>(s, lane % T::kCols, &head, &writer);
        if (writer) sc_s[head * G + t] = tot;
      }
    }
    __syncthreads();

    // ---------------- (2) online softmax, warp per head ----------------
    for (int i = warp; i < QP; i += kDecodeThreads / 32) {
      float sv[(G + 31) / 32];
      float mt = -INFINITY;
      const float ks = F == KvFormat::kFp8 ? a.k_scale[h] : 1.0f;
#pragma unroll
      for (int k = 0; k < (G + 31) / 32; ++k) {
        const int t = lane + 32 * k;
        float s = -INFINITY;
        if (t < n_valid) {
          if (record) {
            float acc_s = qz_s[i];
#pragma unroll
            for (int part = 0; part < T::kParts; ++part) acc_s += sc_s[(part * QP + i) * G + t];
            s = ld_scale(rec + a.s_row_k, t, a.fp8_scales) * acc_s;
          } else {
            s = sc_s[i * G + t] * ks;
          }
        }
        sv[k] = s;
        mt = fmaxf(mt, s);
      }
      mt = warp_max(mt, 32);
      const float m_old = m_s[i];
      const float m_new = fmaxf(m_old, mt);
      const float alpha = exp2f(m_old - m_new);
      float lsum = 0.0f, pz = 0.0f;
      const float vs = F == KvFormat::kFp8 ? a.v_scale[h] : 1.0f;
#pragma unroll
      for (int k = 0; k < (G + 31) / 32; ++k) {
        const int t = lane + 32 * k;
        if (t < G) {
          const float p = exp2f(sv[k] - m_new);
          lsum += p;
          float pv = p * vs;
          if (record) {
            pz += p * __half2float(reinterpret_cast<const __half*>(rec + a.zp_v)[t]);
            pv = p * ld_scale(rec + a.s_row_v, t, a.fp8_scales);
          }
          p_s[t * QP + i] = pv;
        }
      }
      lsum = warp_sum(lsum, 32);
      pz = warp_sum(pz, 32);
      if (lane == 0) {
        m_s[i] = m_new;
        l_s[i] = l_s[i] * alpha + lsum;
        alpha_s[i] = alpha;
        pz_s[i] = pz;
      }
    }
    __syncthreads();

    // ---------------- (3) PV ----------------
    float al[QP];
#pragma unroll
    for (int i = 0; i < QP; ++i) al[i] = alpha_s[i];
    if (record) {
      float at[8][QP];
#pragma unroll
      for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int i = 0; i < QP; ++i) at[k][i] = 0.0f;
      const unsigned char* vc = rec + a.v_codes + col * T::kWordV;
#pragma unroll 2
      for (int t = tg; t < G; t += T::kTGroups) {
        std::uint64_t w;
        if constexpr (T::kWordV == 8) {
          w = *reinterpret_cast<const std::uint64_t*>(vc + t * T::kRowBytesV);
        } else if constexpr (T::kWordV == 4) {
          w = *reinterpret_cast<const std::uint32_t*>(vc + t * T::kRowBytesV);
        } else if constexpr (T::kWordV == 2) {
          w = *reinterpret_cast<const std::uint16_t*>(vc + t * T::kRowBytesV);
        } else {
          w = vc[t * T::kRowBytesV];
        }
        float cf[8];
        cf[0] = code_to_float<VB, 0>(w);
        cf[1] = code_to_float<VB, 1>(w);
        cf[2] = code_to_float<VB, 2>(w);
        cf[3] = code_to_float<VB, 3>(w);
        cf[4] = code_to_float<VB, 4>(w);
        cf[5] = code_to_float<VB, 5>(w);
        cf[6] = code_to_float<VB, 6>(w);
        cf[7] = code_to_float<VB, 7>(w);
        const float4* pv = reinterpret_cast<const float4*>(p_s + t * QP);
#pragma unroll
        for (int i4 = 0; i4 < QP / 4; ++i4) {
          const float4 pw = pv[i4];
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            at[k][4 * i4 + 0] += pw.x * cf[k];
            at[k][4 * i4 + 1] += pw.y * cf[k];
            at[k][4 * i4 + 2] += pw.z * cf[k];
            at[k][4 * i4 + 3] += pw.w * cf[k];
          }
        }
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float sv = ld_scale(rec + a.s_col_v, col * 8 + k, a.fp8_scales);
#pragma unroll
        for (int i = 0; i < QP; ++i)
          acc[k][i] = acc[k][i] * al[i] + sv * (at[k][i] + (tg == 0 ? pz_s[i] : 0.0f));
      }
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int i = 0; i < QP; ++i) acc[k][i] *= al[i];
      const long long base = ((static_cast<long long>(slot) * a.num_kv_heads + h) * G) * D;
#pragma unroll 2
      for (int t = tg; t < n_valid; t += T::kTGroups) {
        float vv[8];
        load8<F == KvFormat::kFp8 ? KvFormat::kFp8 : KvFormat::kFp16>(
            a.v_pool, base + static_cast<long long>(t) * D + col * 8, vv);
        const float4* pv = reinterpret_cast<const float4*>(p_s + t * QP);
#pragma unroll
        for (int i4 = 0; i4 < QP / 4; ++i4) {
          const float4 pw = pv[i4];
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            acc[k][4 * i4 + 0] += pw.x * vv[k];
            acc[k][4 * i4 + 1] += pw.y * vv[k];
            acc[k][4 * i4 + 2] += pw.z * vv[k];
            acc[k][4 * i4 + 3] += pw.w * vv[k];
          }
        }
      }
    }
    __syncthreads();  // buffers (rec, p_s, sc_s) are reused by the next block
  }
  cp_async_wait<0>();
  __syncthreads();

  // ---- reduce the token groups, write the split's normalized output and lse ----
  float* red = reinterpret_cast<float*>(rec_s);  // [kTGroups][QP][D]
#pragma unroll
  for (int k = 0; k < 8; ++k)
#pragma unroll
    for (int i = 0; i < QP; ++i) red[(tg * QP + i) * D + col * 8 + k] = acc[k][i];
  __syncthreads();
  for (int idx = tid; idx < QP * D; idx += kDecodeThreads) {
    const int i = idx / D, d = idx % D;
    if (i >= a.qpk) continue;
    float s = 0.0f;
    for (int g = 0; g < T::kTGroups; ++g) s += red[(g * QP + i) * D + d];
    const float l = l_s[i];
    const long long row = static_cast<long long>(b) * a.num_q_heads + h * a.qpk + i;
    a.o_part[(row * a.num_splits + split) * D + d] = l > 0.0f ? s / l : 0.0f;
    if (d == 0) a.lse[row * a.num_splits + split] = l > 0.0f ? m_s[i] + log2f(l) : -INFINITY;
  }
}

// Combine the splits (log-sum-exp in the exp2 domain), un-rotate, write fp16.
// grid (Hq, batch), D threads.
template <int D>
__global__ void __launch_bounds__(D) combine_kernel(const float* o_part, const float* lse,
                                                    int num_q_heads, int num_splits,
                                                    float rot_scale, __half* out) {
  __shared__ float x[D];
  const long long row = static_cast<long long>(blockIdx.y) * num_q_heads + blockIdx.x;
  const int d = threadIdx.x;
  float mx = -INFINITY;
  for (int s = 0; s < num_splits; ++s) mx = fmaxf(mx, lse[row * num_splits + s]);
  float num = 0.0f, den = 0.0f;
  if (mx != -INFINITY) {
    for (int s = 0; s < num_splits; ++s) {
      const float w = exp2f(lse[row * num_splits + s] - mx);
      num += w * o_part[(row * num_splits + s) * D + d];
      den += w;
    }
  }
  x[d] = den > 0.0f ? num / den : 0.0f;
  __syncthreads();
  if (rot_scale != 0.0f) {
    for (int hs = 1; hs < D; hs <<= 1) {
      if (d < D / 2) {
        const int j = (d / hs) * 2 * hs + d % hs;
        const float u = x[j], w = x[j + hs];
        x[j] = u + w;
        x[j + hs] = u - w;
      }
      __syncthreads();
    }
    x[d] *= rot_scale;
  }
  out[row * D + d] = __float2half_rn(x[d]);
}

}  // namespace kvarn::cuda

#endif  // KVARN_CUDA_DECODE_CUH_
