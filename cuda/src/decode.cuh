// Paged decode attention over a KVarN / FP16 / FP8 cache on tensor cores, split-K with a
// log-sum-exp combine.
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
//   query head hq uses KV head hq / (Hq / Hkv), Hq / Hkv <= 8.
// Workspace: o_part [batch, Hq, S, D] f32 (normalized by the split's l), lse [batch, Hq, S]
//   f32 (log2 domain, -inf for an empty split); a CTA of two warps merges their states first.
//
// Split kernel: grid (S, Hkv, batch), W warps per CTA: W = 1 (KVarN G 32; no block barriers: the
// record's per-record work, q'' and the output update, is done once per record), 2 (FP16, FP8,
// KVarN G 64: the two warps share the stages, one barrier per item, and split each record's
// tokens and each row item's rows in halves), KVarN G 128: 1 or 2, both compiled, chosen per
// problem by the host (decode_num_warps). A warp serves the query-head group of
// its KV head (padded to N = 8 heads: the mma N dimension; KVarN G 128 with at most 4 heads: the
// heads of two M-tiles of a record, the kPair instances) and logical blocks
// [s * ceil(nb / S), (s + 1) * ceil(nb / S)) of its sequence; the KVarN kSpread instance: row
// chunks [s * ceil(nc / S), ...) of the nc chunks of its fp16 sink, then blocks
// nsb + [s * ceil(nr / S), ...) of the nr blocks after it (detail::item_range).
// Work items stream through kStages shared-memory stages (kStages - 1 ahead):
//   record item: one whole KVarN record (G tokens), copied verbatim by one bulk copy
//                (cp.async.bulk, issued by thread 0) that completes on the stage's mbarrier;
//                record_in_pieces (G 128, one warp, k4v4): two items, the key piece
//                (bytes [0, v_codes): scores and softmax) then the value piece ([v_codes, end):
//                P V), the scores carried from one to the other in registers;
//   row item:    (cp.async) kRowTok fp16 / e4m3 K rows then V rows of a pool block / page
//                (rows padded to D * elem + 16 bytes; rows past the sequence are zero-filled);
//                KVarN: 16 rows per warp, each warp takes its own 16.
// Per item, on mma.sync m16n8k16 (fp16 in, fp32 accumulate), lane = 4 g + c:
//   QK^T:  A = K [tokens (M) x channels (k)], B = q'^T [channels x 8 heads], C = S^T.
//   PV:    A = V^T [channels (M) x tokens (k)], B = P'^T (the C fragment of S^T turned into a
//          B fragment by movmatrix.trans), C = O^T [channels x 8 heads].
//   KVarN records: scales are factored out of the products so the mma runs on raw codes,
//     S[t,h] = s_row_k[t] * (kmax * sum_d q''[h,d] code_k[d,t] + sum_d q[h,d] zp_k[d]),
//       q'' = q * s_col_k / kmax in fp16 (kmax: the power of two of max |s_col_k| of the record,
//       so that q'' is the fp16 query times exact fp16 products, rounded once), and
//       sum_d q zp_k by one mma per k-step of the fp16 query against zp_k broadcast to all rows;
//     O[h,d] += s_col_v[d] * (vmax * sum_t p''[h,t] code_v[t,d] + sum_t p[h,t] zp_v[t]),
//       p'' = p * s_row_v / vmax in fp16 (vmax: the power of two of max |s_row_v|).
//     A code field enters the mma as the fp16 subnormal its masked bits already are, c 2^(f
//     bits) 2^-24 (codes_sub: one and; exact, and the tensor cores multiply subnormals at
//     their value): K fragments pair two channel rows (prmt of the two rows' bytes), V
//     fragments pair two token rows. The zero-point sums are one term per field and head, the
//     chain's start value: QK: qz 2^(f bits) 2^-24 / kmax, PV: sum_t p zp_v 2^(f bits) 2^-24 /
//     vmax; one multiply (QK: by s_row_k kmax 2^(24 - f bits)) or one fma (PV: by s_col_v vmax
//     2^(24 - f bits)) per element finishes the record. (Codes as the normal fp16 1024 + c 2^(f
//     bits) needed the 1024 sum of the other operand taken off each chain, by one more mma per
//     k-step, and chains of at most 64 tokens to bound the cancellation.)
//     Token order inside a record (warp w, T = G / W tokens each): M-tile m, row g + 8 e <->
//     token w T + g T / 8 + 2 m + e, so each lane reads T / 8 consecutive tokens of a channel row
//     with one load.
//   Row items: K fragments by ldmatrix (fp16) / ldmatrix + cvt.e4m3x2 (fp8); V fragments by
//     16-byte loads of two token rows + prmt (+ cvt for fp8).
//   Output channel ownership (all item kinds): O M-tile mt, row g + 8 e <-> channel
//     g * D / 8 + 2 mt + e, heads 2c, 2c + 1.
//   q' channel ownership (B fragment, k-step s, head g): KVarN / FP16: 16 s + 2c + {0, 1, 8, 9};
//     FP8: 16 s + 4c + {0, 1, 2, 3} (the order ldmatrix yields for byte rows).
// The query is rotated (FWHT in registers) and scaled into the exp2 domain once per CTA;
// softmax statistics are online per head (exp2 domain). Never writes K/V anywhere.
#ifndef KVARN_CUDA_DECODE_CUH_
#define KVARN_CUDA_DECODE_CUH_

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common.cuh"

namespace kvarn::cuda {

enum class KvFormat : int { kKvarn = 0, kFp16 = 1, kFp8 = 2 };

constexpr int kDecodeHeads = 8;  // mma N: query heads per KV head, padded

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
  int stage_bytes;  // bytes of one pipeline stage (multiple of 128)
  float qk_scale;   // softmax scale * log2(e)
  float rot_scale;  // 0: no rotation; else Hadamard 1/sqrt(D)
  int fp8_scales;
  int sink_blocks;  // KVarN kSpread: sink blocks to spread over the splits; else 0
  int s_col_k, zp_k, s_row_k, v_codes, s_col_v, s_row_v, zp_v;  // record byte offsets
  float* o_part;
  float* lse;
};

// Warps per CTA of the split kernel (see the header comment): `g128_warps` (1 or 2) is the host's
// choice for KVarN G 128, the only case compiled both ways.
__host__ __device__ constexpr int decode_warps(KvFormat f, int group, int g128_warps) {
  return f != KvFormat::kKvarn || group == 64 ? 2 : group == 128 ? g128_warps : 1;
}

// Query heads per KV head up to which the kernels fill the mma's 8 columns with two halves of 4:
// KVarN G 128 two M-tiles of a record (kPair of paged_decode_kernel), TurboQuant two items
// (kPair of paged_decode_tq_kernel).
constexpr int kPairHeads = kDecodeHeads / 2;

// KVarN G 128 on one warp with at least 16 KiB of codes per record and at most 8 KiB per piece
// (k4v4 at D 128; k8v8's pieces would allow only 6 CTAs) streams each record as two pieces, keys
// (codes and scales before v_codes) then values, each in its own stage. A stage is then about
// half a record (k4v4: 8,960 instead of 17,920 bytes), so 12 CTAs fit the shared memory instead
// of 6; the next record's keys arrive while this record's values are read, half a record ahead
// instead of a whole one. The paired instances (at most 4 query heads per KV head) are capped at
// 168 registers, so that 3 one-warp CTAs fit each scheduler and the 12 CTAs the registers too;
// the unpaired ones need 254 (they spill at 168) and get 8 CTAs per SM. H200: k4v4 on one warp
// 1.12-1.22x faster than with whole records at Hq 32; k4v2 (8 CTAs per SM with whole records)
// 0.87-0.99x, the shorter prefetch costing more than the extra CTAs give.
__host__ __device__ constexpr bool record_in_pieces(KvFormat f, int head_dim, int group, int kb,
                                                    int vb, int warps) {
  const int key_codes = kb * head_dim * group / 8, value_codes = vb * head_dim * group / 8;
  return f == KvFormat::kKvarn && group == 128 && warps == 1 && key_codes + value_codes >= 16384 &&
         key_codes <= 8192 && value_codes <= 8192;
}

// Resident CTAs per SM the registers must allow (__launch_bounds__): KVarN on two warps 6 (12
// warps fit the shared memory; 168 registers), paired records in pieces 12, else no bound.
__host__ __device__ constexpr int decode_min_ctas(KvFormat f, int head_dim, int group, int kb,
                                                  int vb, int warps, bool pair) {
  return f == KvFormat::kKvarn && warps == 2                           ? 6
         : pair && record_in_pieces(f, head_dim, group, kb, vb, warps) ? 12
                                                                       : 1;
}

template <int D, int G, KvFormat F, int KB, int VB, int W>
struct DecodeTraits {
  static constexpr int kKSteps = D / 16;  // QK k-steps == PV M-tiles
  static constexpr int kElem = F == KvFormat::kFp8 ? 1 : 2;
  static constexpr int kWarps = W;  // warps per CTA (header comment)
  // tokens per row item: 16 per warp for KVarN (its pool holds only sink and tail), 32 otherwise
  static constexpr int kRowTok = F == KvFormat::kKvarn ? 16 * kWarps : 32;
  static constexpr int kRowMT = kRowTok / 16;
  static constexpr int kRowMTw = kRowMT / kWarps;  // M-tiles of a row item per warp
  static constexpr int kRowBytes = D * kElem;
  static constexpr int kRowStride = kRowBytes + 16;  // conflict-free ldmatrix / LDS.128
  static constexpr int kRowItemBytes = 2 * kRowTok * kRowStride;
  static constexpr int kStages = F == KvFormat::kFp16 ? 3 : 2;
  // KVarN: kWarps warps per CTA share the stages; warp w takes record tokens
  // [w kTok, (w + 1) kTok) and row-item M-tiles [w kRowMTw, (w + 1) kRowMTw) with its own softmax
  // state (merged at the end): more warps per SM at the same shared memory in flight.
  static constexpr int kTok = G / kWarps;
  // KVarN record geometry (per warp)
  static constexpr int kMT = kTok / 16;  // QK M-tiles == PV k-steps
  static constexpr int kPackK = 8 / KB, kPackV = 8 / VB;
  static constexpr int kKRow = G / kPackK;         // bytes of one K channel row
  static constexpr int kKThr = kTok / 8 / kPackK;  // bytes of it one lane reads
  static constexpr int kVRow = D / kPackV;         // bytes of one V token row
  static constexpr int kVThr = D / 8 / kPackV;     // bytes of it one lane reads
  static constexpr int kTokThr = kTok / 8;         // record tokens owned by a lane group g
  static_assert(D % 32 == 0 && G % 16 == 0, "shape");
  static_assert(F != KvFormat::kKvarn || (kTok / 8) % kPackK == 0, "K code packing");
};

// Host-visible row item size of a format with `warps` warps per CTA (the stage is
// max(record, row item)); it depends on the warps, not on the group.
template <int D, KvFormat F>
constexpr int row_item_bytes(int warps) {
  return warps == 2 ? DecodeTraits<D, 64, F, 8, 8, 2>::kRowItemBytes
                    : DecodeTraits<D, 32, F, 8, 8, 1>::kRowItemBytes;
}

namespace detail {

// Scales (fp16 or e4m3) of N consecutive entries starting at p (N * scale bytes aligned).
template <int N>
__device__ __forceinline__ void load_scales(const unsigned char* p, int fp8, float (&out)[N]) {
  if (fp8) {
    std::uint32_t w[(N + 3) / 4];
    lds_bytes<N>(p, w);
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const float2 f = unpack_half2(e4m3x2_to_half2(w[i / 4] >> (8 * (i % 4))));
      out[i] = f.x;
      if (i + 1 < N) out[i + 1] = f.y;
    }
  } else {
    std::uint32_t w[(2 * N + 3) / 4];
    lds_bytes<2 * N>(p, w);
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const float2 f = unpack_half2(w[i / 2]);
      out[i] = f.x;
      if (i + 1 < N) out[i + 1] = f.y;
    }
  }
}
// prmt selector (an immediate): byte k of a -> byte 0, byte k of b -> byte 2.
__host__ __device__ constexpr std::uint32_t pair_sel(int k) {
  return static_cast<std::uint32_t>(k | (k << 4) | ((4 + k) << 8) | ((4 + k) << 12));
}

// Online softmax over one item's scores sc[m][*] (heads 2c: [0], [2]; 2c + 1: [1], [3]; kPairCols:
// columns 2c and 2c + 1 are heads 2 (c & 1) and 2 (c & 1) + 1, so lanes c and c ^ 2 share them).
// Replaces scores by p = exp2(s - m_new); returns the rescale factors of O.
template <int MT, bool kPairCols = false>
__device__ __forceinline__ void online_softmax(float (&sc)[MT][4], float (&m)[2], float (&l)[2],
                                               float (&alpha)[2]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    mx[0] = fmaxf(mx[0], fmaxf(sc[i][0], sc[i][2]));
    mx[1] = fmaxf(mx[1], fmaxf(sc[i][1], sc[i][3]));
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
#pragma unroll
    for (int o = kPairCols ? 2 : 4; o < 32; o <<= 1)
      mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], o));
    const float mn = fmaxf(m[k], mx[k]);
    const float base = mn == -INFINITY ? 0.0f : mn;
    alpha[k] = fast_exp2(m[k] - base);
    m[k] = mn;
    mx[k] = base;
  }
  float ls[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      sc[i][r] = fast_exp2(sc[i][r] - mx[r & 1]);
      ls[r & 1] += sc[i][r];
    }
  l[0] = l[0] * alpha[0] + ls[0];
  l[1] = l[1] * alpha[1] + ls[1];
}

// kPairCols: columns h and h + 4 of O are both head h (lanes c and c ^ 2 hold them); adds the
// two halves, so the lanes c < 2 hold each head's output.
template <int KS>
__device__ __forceinline__ void add_pair_cols(float (&o)[KS][4]) {
#pragma unroll
  for (int mt = 0; mt < KS; ++mt)
#pragma unroll
    for (int r = 0; r < 4; ++r) o[mt][r] += __shfl_xor_sync(0xffffffffu, o[mt][r], 2);
}

// Merge the online-softmax states of a CTA's two warps (same fragment ownership per lane): warp 1
// writes its output, maxima and sums to `xfer` ([4 KS + 4][32] floats, lane-minor: no bank
// conflicts), warp 0 rescales both to the common maximum and adds. Every thread of the CTA calls
// it (it holds a barrier); true for the warp that holds the merged state (warp 0).
template <int KS>
__device__ __forceinline__ bool merge_warp_pair(float* xfer, int warp, int lane, float (&o)[KS][4],
                                                float (&m)[2], float (&l)[2]) {
  if (warp == 1) {
#pragma unroll
    for (int i = 0; i < KS; ++i)
#pragma unroll
      for (int r = 0; r < 4; ++r) xfer[(4 * i + r) * 32 + lane] = o[i][r];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      xfer[(4 * KS + k) * 32 + lane] = m[k];
      xfer[(4 * KS + 2 + k) * 32 + lane] = l[k];
    }
  }
  __syncthreads();
  if (warp != 0) return false;
  float a0[2], a1[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float m1 = xfer[(4 * KS + k) * 32 + lane], l1 = xfer[(4 * KS + 2 + k) * 32 + lane];
    const float mn = fmaxf(m[k], m1);
    const float base = mn == -INFINITY ? 0.0f : mn;  // both empty: l stays 0
    a0[k] = fast_exp2(m[k] - base);
    a1[k] = fast_exp2(m1 - base);
    m[k] = mn;
    l[k] = l[k] * a0[k] + l1 * a1[k];
  }
#pragma unroll
  for (int i = 0; i < KS; ++i)
#pragma unroll
    for (int r = 0; r < 4; ++r)
      o[i][r] = o[i][r] * a0[r & 1] + xfer[(4 * i + r) * 32 + lane] * a1[r & 1];
  return true;
}

// Channel of q' element e (0..3) of k-step s for lane column c (see the header comment).
template <KvFormat F>
__device__ __forceinline__ int q_channel(int s, int c, int e) {
  if constexpr (F == KvFormat::kFp8) return 16 * s + 4 * c + e;
  return 16 * s + 2 * c + (e & 1) + 8 * (e >> 1);
}

// The column scales of a KVarN record at the lane's q' channels (q_channel) as the half2 pairs of
// the B fragment (qb's order), fp16 or e4m3 (both exact in fp16).
template <int KS, KvFormat F, bool kFp8>
__device__ __forceinline__ void load_col_scales(const unsigned char* p, int c,
                                                std::uint32_t (&sk)[KS][2]) {
#pragma unroll
  for (int s = 0; s < KS; ++s)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int i = q_channel<F>(s, c, 2 * e);  // even
      sk[s][e] = kFp8 ? e4m3x2_to_half2(*reinterpret_cast<const unsigned short*>(p + i))
                      : *reinterpret_cast<const std::uint32_t*>(p + 2 * i);
    }
}

// Scales (fp16 or e4m3) of 2 N consecutive entries starting at p as N half2 (exact).
template <int N>
__device__ __forceinline__ void load_scales_h2(const unsigned char* p, int fp8,
                                               std::uint32_t (&out)[N]) {
  if (fp8) {
    std::uint32_t w[(2 * N + 3) / 4];
    lds_bytes<2 * N>(p, w);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = e4m3x2_to_half2(w[i / 2] >> (16 * (i % 2)));
  } else {
    lds_bytes<4 * N>(p, out);
  }
}

// The largest |x| over N half2 (finite), as a float: a tree (depth log2 N instead of a chain of N
// dependent max).
template <int N>
__device__ __forceinline__ float abs_max_h2(const std::uint32_t* x) {
  __half2 t[N];
#pragma unroll
  for (int i = 0; i < N; ++i) t[i] = __habs2(as_half2(x[i]));
#pragma unroll
  for (int h = 1; h < N; h <<= 1)
#pragma unroll
    for (int i = 0; i + h < N; i += 2 * h) t[i] = __hmax2(t[i], t[i + h]);
  return fmaxf(__low2float(t[0]), __high2float(t[0]));
}

// A record's scale normalization: the power of two 2^e <= xmax < 2^(e + 1), clamped to
// [2^-14, 2^15] so that its reciprocal is exact in fp16 too; 1 when xmax is 0. Multiplying fp16
// scales by the reciprocal is exact (up to results below the fp16 normal range), so the fp16
// operands q'' and p'' are rounded once, by their one product.
__device__ __forceinline__ float pow2_scale(float xmax) {
  if (!(xmax > 0.0f)) return 1.0f;
  const float p = __int_as_float(__float_as_int(xmax) & 0x7f800000);
  return fminf(fmaxf(p, 0x1p-14f), 0x1p15f);
}
// 1 / x for x a power of two within pow2_scale's range (exact).
__device__ __forceinline__ float pow2_inv(float x) {
  return __int_as_float(0x7f000000 - __float_as_int(x));
}

// The items of one split. KVarN's fp16 sink (its first `sink_blocks` blocks, in the pool) goes
// to the splits in row chunks of kRowTok tokens (chunk c: block c / (G / kRowTok), rows from
// (c % (G / kRowTok)) kRowTok), the other blocks in even runs: when one split read the whole sink
// (8 row items for one warp) it was the last to finish (H200, k4v2 batch 8 x 16K: 43.5 against
// 35.2 us for the other splits). Chunks [c_begin, c_end), then blocks [j_begin, j_end).
struct ItemRange {
  int c_begin, c_end, j_begin, j_end;
};
template <int G, int kRowTok>
__device__ __forceinline__ ItemRange item_range(const SplitBlocks& r, int max_blocks,
                                                int sink_blocks, int split, int num_splits) {
  if (sink_blocks <= 0) return {0, 0, r.j_begin, r.j_end};
  const int nb = min((r.len + G - 1) / G, max_blocks);
  const int nsb = min(sink_blocks, nb);
  const int chunks = (min(nsb * G, r.len) + kRowTok - 1) / kRowTok;
  const int cps = (chunks + num_splits - 1) / num_splits;
  const int nr = nb - nsb, bps = (nr + num_splits - 1) / num_splits;
  ItemRange o;
  o.c_begin = min(chunks, split * cps);
  o.c_end = min(chunks, o.c_begin + cps);
  o.j_begin = nsb + min(nr, split * bps);
  o.j_end = nsb + min(nr, split * bps + bps);
  return o;
}

// The start value of the code chains of a record (header comment): codes enter the mma as the
// subnormals c 2^(f kBits) 2^-24, so for pack field f and the lane's heads 2c, 2c + 1 the chain
// starts at zsum 2^(f kBits) 2^-24 inv (zsum: the zero-point sum, inv: 1 / the record's scale
// maximum; powers of two, exact). QK and PV use the same form.
template <int kPack, int kBits>
__device__ __forceinline__ void chain_start(const float* zsum, float inv, float (&out)[kPack][2]) {
#pragma unroll
  for (int f = 0; f < kPack; ++f)
#pragma unroll
    for (int k = 0; k < 2; ++k)
      out[f][k] = zsum[k] * (inv * (static_cast<float>(1 << (f * kBits)) / 16777216.0f));
}
// 2^(24 - f kBits): undoes a field's subnormal code scale (codes_sub) after the mma.
template <int kBits>
__device__ __forceinline__ constexpr float unsub_scale(int f) {
  return 16777216.0f / static_cast<float>(1 << (f * kBits));
}

}  // namespace detail

// kSpread (KVarN): the fp16 sink's row chunks go to the splits (detail::item_range); a separate
// instance, as its bookkeeping cost the other shapes 1-4 % (H200).
// kPair (KVarN, at most 4 query heads per KV head): the mma's 8 columns carry the 4 heads of two
// M-tiles of a record, m (columns 0-3) and m + kMT / 2 (columns 4-7), instead of 4 heads and 4
// padding columns: the scores of a record fill half the fragments, so scaling, softmax and p''
// run once per two tiles (the same mma count; their B fragments are the query with the other
// half's columns zeroed). Columns h and h + 4 are head h: lanes c and c ^ 2 share its softmax
// state, and the two halves of O are added once at the end.
template <int D, int G, KvFormat F, int KB, int VB, int W, bool kSpread = false, bool kPair = false>
__global__ void __launch_bounds__(32 * W, decode_min_ctas(F, D, G, KB, VB, W, kPair))
    paged_decode_kernel(DecodeArgs a) {
  using T = DecodeTraits<D, G, F, KB, VB, W>;
  static_assert(!kSpread || F == KvFormat::kKvarn, "only KVarN has a sink");
  static_assert(!kPair || (F == KvFormat::kKvarn && T::kMT % 2 == 0 && T::kMT % T::kPackK == 0),
                "paired tiles: the second half's tokens start at a whole pack field");
  static_assert(W == decode_warps(F, G, W), "warps per CTA of this format and group");
  constexpr int KS = T::kKSteps;
  constexpr int kStages = T::kStages;
  constexpr bool kPieces = record_in_pieces(F, D, G, KB, VB, W);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  static_assert(kStages <= 4, "desc + mbarriers fit the 128-byte header");
  // [kStages] {0 rows / 1 record or key piece / 2 value piece, block, row0, valid rows}
  int4* desc = reinterpret_cast<int4*>(smem_raw);
  // KVarN records arrive by the bulk copy engine: one mbarrier per stage (bytes 64..95); bytes
  // 96..103: the split's sink chunks
  std::uint64_t* bars = reinterpret_cast<std::uint64_t*>(smem_raw + 64);
  unsigned char* stages = smem_raw + 128;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
  constexpr int kThreads = 32 * T::kWarps;
  if constexpr (F == KvFormat::kKvarn) {
    if (tid == 0)
#pragma unroll
      for (int i = 0; i < kStages; ++i) mbar_init(&bars[i], 1);
    if constexpr (T::kWarps > 1) {
      __syncthreads();
    } else {
      __syncwarp();
    }
  }
  unsigned bar_phase = 0;  // bit i: parity of the next phase of bars[i] to wait for
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const SplitBlocks range = split_blocks(a.seq_lens, a.block_table, a.max_blocks, G, a.num_splits);
  const detail::ItemRange items = kSpread
                                      ? detail::item_range<G, T::kRowTok>(
                                            range, a.max_blocks, a.sink_blocks, split, a.num_splits)
                                      : detail::ItemRange{0, 0, range.j_begin, range.j_end};
  const int len = range.len, j_begin = items.j_begin, j_end = items.j_end;
  const int* table = range.table;
  // kSpread: {c_begin, n_sink} of the split's sink chunks (issue), in the header: registers are
  // what limits the two-warp instances
  int* sink_hdr = reinterpret_cast<int*>(smem_raw + 96);
  if constexpr (kSpread) {
    if (tid == 0) {
      sink_hdr[0] = items.c_begin;
      sink_hdr[1] = items.c_end - items.c_begin;
    }
    if constexpr (T::kWarps > 1) {
      __syncthreads();
    } else {
      __syncwarp();
    }
  }

  // ---- query fragment: head g (kPair: g & 3), channels q_channel(s, c, e); rotate; scale ----
  std::uint32_t qb[KS][2];  // fp16 B fragments of the (scaled) query
  // kPair: lanes g < 4 hold the B columns 0-3 (a record's first M-tiles, the row items)
  const std::uint32_t lo_cols = kPair && g >= 4 ? 0u : 0xffffffffu;
  auto load_query = [&]() {
    float qf[KS][4];
    const int qh = kPair ? (g & 3) : g;
    const bool live = qh < a.qpk;
    const __half* qrow = a.q + (static_cast<long long>(b) * a.num_q_heads + h * a.qpk + qh) * D;
#pragma unroll
    for (int s = 0; s < KS; ++s)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        float2 v = make_float2(0.0f, 0.0f);
        if (live)
          v = __half22float2(
              *reinterpret_cast<const __half2*>(qrow + detail::q_channel<F>(s, c, e)));
        qf[s][e] = v.x;
        qf[s][e + 1] = v.y;
      }
    if constexpr (F != KvFormat::kFp8) {
      if (a.rot_scale != 0.0f) fwht_fragments<KS>(qf, c);  // channel bits: e0 | c | e1 | s
    }
    float scale = (a.rot_scale != 0.0f ? a.rot_scale : 1.0f) * a.qk_scale;
    if constexpr (F == KvFormat::kFp8) scale *= a.k_scale[h];
#pragma unroll
    for (int s = 0; s < KS; ++s)
#pragma unroll
      for (int e = 0; e < 4; ++e) qf[s][e] *= scale;
#pragma unroll
    for (int s = 0; s < KS; ++s) {
      qb[s][0] = pack_half2(qf[s][0], qf[s][1]);
      qb[s][1] = pack_half2(qf[s][2], qf[s][3]);
    }
  };

  float o[KS][4];
#pragma unroll
  for (int i = 0; i < KS; ++i)
#pragma unroll
    for (int r = 0; r < 4; ++r) o[i][r] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

  // ---- producer: block metadata window (lane i holds block win_base + i) ----
  int win_base = -1000000, win = 0;
  auto block_meta = [&](int j) {  // KVarN: record -> phys >= 0, pool -> -(slot + 1)
    if (j - win_base >= 32) {
      win_base = j;
      const int jj = j + lane;
      win = 0;
      if (jj < j_end) {
        const int phys = table[jj];
        if constexpr (F == KvFormat::kKvarn) {
          const int slot = a.block_to_slot[phys];
          win = slot >= 0 ? -(slot + 1) : phys;
        } else {
          win = -(phys + 1);
        }
      }
    }
    return __shfl_sync(0xffffffffu, win, j - win_base);
  };
  auto sink_meta = [&](int j) {  // block_meta's value by direct loads (a split reads few)
    const int phys = table[j];
    if constexpr (F == KvFormat::kKvarn) {
      const int slot = a.block_to_slot[phys];
      return slot >= 0 ? -(slot + 1) : phys;
    }
    return -(phys + 1);
  };
  // Bytes [from, to) of record `meta` (>= 0) into `stage` in one bulk copy (sizes and addresses
  // 16-byte aligned: host checks).
  auto copy_record_bytes = [&](int stage, int meta, long long from, long long to) {
    if (tid == 0) {
      const unsigned char* src =
          a.records + (static_cast<long long>(meta) * a.num_kv_heads + h) * a.record_bytes + from;
      const unsigned bytes = static_cast<unsigned>(to - from);
      mbar_arrive_expect_tx(&bars[stage], bytes);
      bulk_copy_g2s(stages + stage * a.stage_bytes, src, bytes, &bars[stage]);
    }
  };
  // The whole record, or (kPieces) its key piece; the value piece follows as the next item, with
  // the key piece's descriptor d but kind 2.
  int pending_values = -1;  // kPieces: the record whose value piece is the next item, else -1
  int4 pending_desc = make_int4(0, 0, 0, 0);
  auto copy_record = [&](int stage, int meta, int4 d) {
    if constexpr (kPieces) {
      copy_record_bytes(stage, meta, 0, a.v_codes);
      pending_values = meta;
      pending_desc = make_int4(2, d.y, d.z, d.w);
    } else {
      copy_record_bytes(stage, meta, 0, a.record_bytes);
    }
  };
  // Rows [row0, row0 + n) of pool slot `slot` into dst (rows up to kRowTok zero-filled).
  auto copy_rows = [&](unsigned char* dst, int slot, int row0, int n) {
    const long long off =
        ((static_cast<long long>(slot) * a.num_kv_heads + h) * G + row0) * T::kRowBytes;
    const unsigned char* kb = static_cast<const unsigned char*>(a.k_pool) + off;
    const unsigned char* vb = static_cast<const unsigned char*>(a.v_pool) + off;
    // Thread t copies chunk t % kCpr of rows t / kCpr + k kRps (k = 0, 1, ...): K rows, then V
    // rows; the row pattern is compile-time per k, so no per-chunk index arithmetic.
    constexpr int kCpr = T::kRowBytes / 16, kRps = kThreads / kCpr;  // chunks/row, rows/sweep
    static_assert(kThreads % kCpr == 0 && T::kRowTok % kRps == 0, "row copy pattern");
    const int q16 = tid % kCpr, r0 = tid / kCpr;
#pragma unroll
    for (int k = 0; k < 2 * T::kRowTok / kRps; ++k) {
      const int kv = k * kRps / T::kRowTok, r = r0 + (k * kRps) % T::kRowTok;
      const bool valid = r < n;
      const unsigned char* src = (kv ? vb : kb) + (valid ? r * T::kRowBytes + q16 * 16 : 0);
      unsigned char* d16 = dst + (kv * T::kRowTok + r) * T::kRowStride + q16 * 16;
      if constexpr (F == KvFormat::kFp16) {
        cp_async16_l2_128(d16, src, valid);
      } else {
        cp_async16(d16, src, valid);
      }
    }
  };
  // Items in order: this split's sink chunks (kSpread; items [0, n_sink): chunk c_begin + i),
  // then its blocks (row items of pool blocks in kRowTok-token chunks).
  constexpr int kChunks = G / T::kRowTok;  // row chunks per block
  int pj = j_begin, pc = 0;                // next block / row chunk to issue
  int issued = 0;                          // items issued
  auto in_sink = [&] {
    if constexpr (kSpread) return issued < sink_hdr[1];
    return false;
  };
  auto more = [&] { return (kPieces && pending_values >= 0) || in_sink() || pj < j_end; };
  // Sink chunk `issued` of this split (kSpread): pool rows, or, where the sink block holds a
  // record instead, the whole record for its chunk 0 and empty (zero-filled) items for the rest.
  // kPieces: a sink record's value piece takes the item count (`issued`) of the chunk after the
  // record's, which is an empty item of the same block (a record is a block's chunk 0 and a block
  // has kChunks >= 2 chunks), so no chunk that holds rows is skipped.
  static_assert(!kPieces || !kSpread || G / T::kRowTok >= 2, "sink chunks after a record");
  auto issue_sink_chunk = [&](int stage) {
    const int ch = sink_hdr[0] + issued, j = ch / kChunks, row0 = (ch % kChunks) * T::kRowTok;
    const int meta = sink_meta(j), n_valid = min(G, len - j * G);
    int4 d;
    if (meta >= 0 && row0 == 0) {
      d = make_int4(1, j, 0, n_valid);
      copy_record(stage, meta, d);
    } else {
      const int n = meta >= 0 ? 0 : min(T::kRowTok, n_valid - row0);
      copy_rows(stages + stage * a.stage_bytes, meta >= 0 ? 0 : -(meta + 1), row0, n);
      d = make_int4(0, j, row0, n);
    }
    if (tid == 0) desc[stage] = d;
  };
  // The next item into stage issued % kStages.
  auto issue = [&] {
    const int stage = issued % kStages;
    if constexpr (kPieces) {
      if (pending_values >= 0) {  // the value piece of the record issued last
        copy_record_bytes(stage, pending_values, a.v_codes, a.record_bytes);
        pending_values = -1;
        ++issued;
        if (tid == 0) desc[stage] = pending_desc;
        return;
      }
    }
    if constexpr (kSpread) {
      if (in_sink()) {
        issue_sink_chunk(stage);
        ++issued;
        return;
      }
    }
    ++issued;
    const int meta = block_meta(pj);
    unsigned char* dst = stages + stage * a.stage_bytes;
    const int n_valid = min(G, len - pj * G);
    int4 d;
    if (F == KvFormat::kKvarn && meta >= 0) {
      d = make_int4(1, pj, 0, n_valid);
      copy_record(stage, meta, d);
      ++pj;
    } else {
      const int slot = -(meta + 1), row0 = pc * T::kRowTok;
      const int n = min(T::kRowTok, n_valid - row0);
      copy_rows(dst, slot, row0, n);
      d = make_int4(0, pj, row0, n);
      if (row0 + T::kRowTok >= n_valid) {
        ++pj;
        pc = 0;
      } else {
        ++pc;
      }
    }
    if (tid == 0) desc[stage] = d;
  };

  // ---------------- KVarN record item ----------------
  // Score fragments of a record (M-tiles per column half) and the record tokens whose scores a
  // lane holds; the scores pass from the key part to the value part (kPieces: across items).
  constexpr int kSM = T::kMT / (kPair ? 2 : 1) > 0 ? T::kMT / (kPair ? 2 : 1) : 1;
  constexpr int kLT = 2 * kSM;
  const int tb = warp * T::kTok;  // this warp's first record token
  // scores: fragment m, row g + 8 e <-> token tok0 + 2 m + e (kPair: the lanes c >= 2 hold the
  // second half's tokens, kMT further; fields agree since kMT % kPackK == 0)
  const int tok_lane = g * T::kTokThr + (kPair && c >= 2 ? T::kMT : 0);
  // Keys: scores of the record's tokens into sc, then the online softmax (sc: p, O rescaled).
  // rec: the record (kPieces: its key piece, bytes [0, v_codes)).
  auto process_keys = [&](const unsigned char* rec, int n_valid, float(&sc)[kSM][4]) {
    if constexpr (F == KvFormat::kKvarn) {
      const int sb = a.fp8_scales ? 1 : 2;  // bytes per row scale
      // q'' = q * s_col_k / kscale (fp16 B fragments: two exact half2 products by 1 / kscale and
      // one rounded product by the fp16 query), kscale = pow2_scale(max |s_col_k|) (1 when every
      // column scale is 0, so the zero-point term below survives); qz = sum_d q zp_k for head g
      std::uint32_t sk[KS][2];
      if (a.fp8_scales) {  // one branch for the block (per-pair selects issued both paths)
        detail::load_col_scales<KS, F, true>(rec + a.s_col_k, c, sk);
      } else {
        detail::load_col_scales<KS, F, false>(rec + a.s_col_k, c, sk);
      }
      // qz = sum_d q zp_k per head by mma: A = zp_k broadcast to all 16 rows (the lane's raw fp16
      // pairs are exactly the A fragment), B = the fp16 query; C row g, columns 2c, 2c + 1 are
      // heads 2c, 2c + 1. Replaces 32 conversions + 32 fma + 4 shuffles per lane.
      float qzc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        const std::uint32_t z0 = *reinterpret_cast<const std::uint32_t*>(
            rec + a.zp_k + 2 * detail::q_channel<F>(s, c, 0));
        const std::uint32_t z2 = *reinterpret_cast<const std::uint32_t*>(
            rec + a.zp_k + 2 * detail::q_channel<F>(s, c, 2));
        const std::uint32_t za[4] = {z0, z0, z2, z2};
        mma_16816(qzc, za, qb[s]);
      }
      float kmax = detail::abs_max_h2<2 * KS>(&sk[0][0]);
      kmax = fmaxf(kmax, __shfl_xor_sync(0xffffffffu, kmax, 1));
      kmax = fmaxf(kmax, __shfl_xor_sync(0xffffffffu, kmax, 2));
      const float kscale = detail::pow2_scale(kmax), kinv = detail::pow2_inv(kscale);
      const __half2 kinv2 = __float2half2_rn(kinv);
      // kPair: kb holds the columns 0-3 (the first half of the M-tiles), kbh the columns 4-7
      std::uint32_t kb[KS][2], kbh[kPair ? KS : 1][2];
#pragma unroll
      for (int s = 0; s < KS; ++s)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          kb[s][e] = half2_bits(__hmul2(as_half2(qb[s][e]), __hmul2(as_half2(sk[s][e]), kinv2)));
      if constexpr (kPair) {
#pragma unroll
        for (int s = 0; s < KS; ++s)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            kbh[s][e] = kb[s][e] & ~lo_cols;
            kb[s][e] &= lo_cols;
          }
      }
      // The codes enter the mma as c 2^(f KB) 2^-24 (field f = token % kPackK): the k-chain
      // started at kin = qz 2^(f KB) 2^-24 / kscale ends at (kscale sum_d q'' code + qz) 2^(f KB)
      // 2^-24 / kscale, and one multiply by s_row_k kscale 2^(24 - f KB) gives the score.
      float kin[T::kPackK][2];
      detail::chain_start<T::kPackK, KB>(qzc, kinv, kin);

      // S^T = K codes x q'': lane reads channel rows 16 s + 2c + {0, 1, 8, 9}; M-tile m goes to
      // fragment m % kSM (kPair: tiles kSM.. against the columns 4-7)
      const unsigned char* kc = rec + tb / T::kPackK + g * T::kKThr;
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        const int r0 = 16 * s + 2 * c;
        std::uint32_t w0[(T::kKThr + 3) / 4], w1[(T::kKThr + 3) / 4], w2[(T::kKThr + 3) / 4],
            w3[(T::kKThr + 3) / 4];
        lds_bytes<T::kKThr>(kc + r0 * T::kKRow, w0);
        lds_bytes<T::kKThr>(kc + (r0 + 1) * T::kKRow, w1);
        lds_bytes<T::kKThr>(kc + (r0 + 8) * T::kKRow, w2);
        lds_bytes<T::kKThr>(kc + (r0 + 9) * T::kKRow, w3);
#pragma unroll
        for (int m = 0; m < T::kMT; ++m) {
          std::uint32_t af[4];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int i = 2 * m + e, j = i / T::kPackK;
            const std::uint32_t x0 = __byte_perm(w0[j / 4], w1[j / 4], detail::pair_sel(j % 4));
            const std::uint32_t x1 = __byte_perm(w2[j / 4], w3[j / 4], detail::pair_sel(j % 4));
            af[e] = codes_sub_at<KB, T::kPackK>(x0, i);
            af[2 + e] = codes_sub_at<KB, T::kPackK>(x1, i);
          }
          const std::uint32_t(&bq)[2] = kPair && m >= kSM ? kbh[kPair ? s : 0] : kb[s];
          if (s == 0 && m < kSM) {  // rows 2m, 2m + 1 of the lane's tokens: fields (2m) % P, ..
            const int f0 = (2 * m) % T::kPackK, f1 = (2 * m + 1) % T::kPackK;
            const float init[4] = {kin[f0][0], kin[f0][1], kin[f1][0], kin[f1][1]};
            mma_16816_c(sc[m], af, bq, init);
          } else {
            mma_16816(sc[m % kSM], af, bq);
          }
        }
      }
      float sr[kLT];
      detail::load_scales<kLT>(rec + a.s_row_k + (tb + tok_lane) * sb, a.fp8_scales, sr);
#pragma unroll
      for (int t = 0; t < kLT; ++t) sr[t] *= kscale * detail::unsub_scale<KB>(t % T::kPackK);
      const int tok0 = tb + tok_lane;
#pragma unroll
      for (int m = 0; m < kSM; ++m)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int t = 2 * m + (r >> 1);
          sc[m][r] *= sr[t];
        }
      if (n_valid < G) {  // only a sequence's last record is partial: no mask on full ones
#pragma unroll
        for (int m = 0; m < kSM; ++m)
#pragma unroll
          for (int r = 0; r < 4; ++r)
            if (tok0 + 2 * m + (r >> 1) >= n_valid) sc[m][r] = -INFINITY;
      }
      float alpha[2];
      detail::online_softmax<kSM, kPair>(sc, m_run, l_run, alpha);
      // alpha is exactly 1 unless a running max grew: skip the rescale when no lane's did
      if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int mt = 0; mt < KS; ++mt)
#pragma unroll
          for (int r = 0; r < 4; ++r) o[mt][r] *= alpha[r & 1];
      }
    }
  };
  // Values: O += P V of the record's tokens (sc from process_keys). rec: the record's bytes from
  // byte `base` on (the whole record: 0; kPieces: its value piece, v_codes).
  auto process_values = [&](const unsigned char* rec, int base, const float(&sc)[kSM][4]) {
    if constexpr (F == KvFormat::kKvarn) {
      const int sb = a.fp8_scales ? 1 : 2;  // bytes per row scale
      // P'' = p * s_row_v / vscale (whole record; vscale = pow2_scale(max |s_row_v|), so the
      // scales' products by 1 / vscale are exact and P'' is fp16(p) times them, rounded once);
      // PV in one chain over the record's tokens
      std::uint32_t sv[kLT / 2];  // s_row_v of the lane's tokens 2i, 2i + 1 (half2)
      float zv[kLT];
      detail::load_scales_h2<kLT / 2>(rec + (a.s_row_v - base) + (tb + tok_lane) * sb, a.fp8_scales,
                                      sv);
      detail::load_scales<kLT>(rec + (a.zp_v - base) + (tb + tok_lane) * 2, 0, zv);
      float vmax = detail::abs_max_h2<kLT / 2>(sv);
#pragma unroll
      for (int o2 = kPair ? 2 : 4; o2 < 32; o2 <<= 1)
        vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, o2));
      const float vscale = detail::pow2_scale(vmax), vinv = detail::pow2_inv(vscale);
      const __half2 vinv2 = __float2half2_rn(vinv);
      // pb: the B fragments of the P'' tile (kPair: column halves of two M-tiles; pbh the columns
      // 4-7 alone, pb then the columns 0-3 alone)
      std::uint32_t pb[kSM][2], pbh[kPair ? kSM : 1][2];
#pragma unroll
      for (int m = 0; m < kSM; ++m) {
        const __half2 s01 = __hmul2(as_half2(sv[m]), vinv2);  // exact
        pb[m][0] = movmatrix_trans(
            half2_bits(__hmul2(__floats2half2_rn(sc[m][0], sc[m][1]), __low2half2(s01))));
        pb[m][1] = movmatrix_trans(
            half2_bits(__hmul2(__floats2half2_rn(sc[m][2], sc[m][3]), __high2half2(s01))));
      }
      // The codes enter the mma as c 2^(f VB) 2^-24 (field f = channel % kPackV): the chain
      // starts at (sum_t p zp_v) 2^(f VB) 2^-24 / vscale and ends at (vscale sum_t p'' code +
      // sum_t p zp_v) 2^(f VB) 2^-24 / vscale; one fma by s_col_v vscale 2^(24 - f VB) adds it
      // to O. Nothing cancels in the chain, so one chain covers the record.
      // s_col_v vscale 2^(24 - f VB) of the lane's channels g D/8 + ch, loaded once per record:
      // before the chain (one warp: registers to spare) or after its mmas (two warps: capped at
      // 168 registers)
      float scv[D / 8];
      auto load_scv = [&]() {
        detail::load_scales<D / 8>(rec + (a.s_col_v - base) + g * (D / 8) * sb, a.fp8_scales, scv);
#pragma unroll
        for (int ch = 0; ch < D / 8; ++ch)  // g D/8 is a multiple of kPackV
          scv[ch] *= vscale * detail::unsub_scale<VB>(ch % T::kPackV);
      };
      if constexpr (T::kWarps == 1) load_scv();
      float pz[2] = {0.0f, 0.0f};  // sum_t p zp_v over the record's tokens (per column)
#pragma unroll
      for (int m = 0; m < kSM; ++m) {
        pz[0] += sc[m][0] * zv[2 * m] + sc[m][2] * zv[2 * m + 1];
        pz[1] += sc[m][1] * zv[2 * m] + sc[m][3] * zv[2 * m + 1];
      }
#pragma unroll
      for (int o2 = 4; o2 < 32; o2 <<= 1) {
        pz[0] += __shfl_xor_sync(0xffffffffu, pz[0], o2);
        pz[1] += __shfl_xor_sync(0xffffffffu, pz[1], o2);
      }
      float vin[T::kPackV][2];
      detail::chain_start<T::kPackV, VB>(pz, vinv, vin);
      if constexpr (kPair) {
#pragma unroll
        for (int m = 0; m < kSM; ++m)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            pbh[m][e] = pb[m][e] & ~lo_cols;
            pb[m][e] &= lo_cols;
          }
      }

      // O^T tile = V codes^T x P'': M-tile m (k-step) pairs token rows t0 = 2c G/8 + 2m and
      // t0 + G/8; kPair: M-tiles m < kSM against pb[m], m >= kSM against pbh[m - kSM]
      float co[KS][4];
      const unsigned char* vc = rec + (a.v_codes - base) + tb * T::kVRow + g * T::kVThr;
#pragma unroll
      for (int m = 0; m < kSM * (kPair ? 2 : 1); ++m) {
        const std::uint32_t(&bp)[2] = kPair && m >= kSM ? pbh[kPair ? m - kSM : 0] : pb[m];
        const int t0 = 2 * c * T::kTokThr + 2 * m, t1 = t0 + T::kTokThr;
        std::uint32_t u0[(T::kVThr + 3) / 4], u1[(T::kVThr + 3) / 4], u2[(T::kVThr + 3) / 4],
            u3[(T::kVThr + 3) / 4];
        lds_bytes<T::kVThr>(vc + t0 * T::kVRow, u0);
        lds_bytes<T::kVThr>(vc + t1 * T::kVRow, u1);
        lds_bytes<T::kVThr>(vc + (t0 + 1) * T::kVRow, u2);
        lds_bytes<T::kVThr>(vc + (t1 + 1) * T::kVRow, u3);
#pragma unroll
        for (int mt = 0; mt < KS; ++mt) {
          std::uint32_t af[4];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int i = 2 * mt + e, j = i / T::kPackV;
            const std::uint32_t x0 = __byte_perm(u0[j / 4], u1[j / 4], detail::pair_sel(j % 4));
            const std::uint32_t x1 = __byte_perm(u2[j / 4], u3[j / 4], detail::pair_sel(j % 4));
            af[e] = codes_sub_at<VB, T::kPackV>(x0, i);
            af[2 + e] = codes_sub_at<VB, T::kPackV>(x1, i);
          }
          if (m == 0) {  // channels 2mt, 2mt + 1 of the lane: fields (2mt) % P, (2mt + 1) % P
            const int f0 = (2 * mt) % T::kPackV, f1 = (2 * mt + 1) % T::kPackV;
            const float init[4] = {vin[f0][0], vin[f0][1], vin[f1][0], vin[f1][1]};
            mma_16816_c(co[mt], af, bp, init);
          } else {
            mma_16816(co[mt], af, bp);
          }
        }
      }
      if constexpr (T::kWarps != 1) load_scv();
#pragma unroll
      for (int mt = 0; mt < KS; ++mt)
#pragma unroll
        for (int r = 0; r < 4; ++r) o[mt][r] = fmaf(scv[2 * mt + (r >> 1)], co[mt][r], o[mt][r]);
    }
  };
  float sc_item[kSM][4];  // kPieces: the scores of the record whose value piece is next

  // ---------------- fp16 / e4m3 row item ----------------
  auto process_rows = [&](const unsigned char* st, int n) {
    const unsigned char* ks = st;
    const unsigned char* vs = st + T::kRowTok * T::kRowStride;
    constexpr int kMTw = T::kRowMTw;
    const int mw = warp * kMTw;  // this warp's first M-tile of the item
    float sc[kMTw][4];
#pragma unroll
    for (int m = 0; m < kMTw; ++m) {
#pragma unroll
      for (int r = 0; r < 4; ++r) sc[m][r] = 0.0f;
      const unsigned char* krow =
          ks + (16 * (mw + m) + (lane & 7) + ((lane >> 3) & 1) * 8) * T::kRowStride +
          (lane >> 4) * 16;
      if constexpr (F == KvFormat::kFp8) {
#pragma unroll
        for (int s2 = 0; s2 < KS / 2; ++s2) {
          std::uint32_t r4[4];
          ldmatrix_x4(r4, krow + s2 * 32);
          const std::uint32_t a0[4] = {e4m3x2_to_half2(r4[0]), e4m3x2_to_half2(r4[1]),
                                       e4m3x2_to_half2(r4[0] >> 16), e4m3x2_to_half2(r4[1] >> 16)};
          const std::uint32_t a1[4] = {e4m3x2_to_half2(r4[2]), e4m3x2_to_half2(r4[3]),
                                       e4m3x2_to_half2(r4[2] >> 16), e4m3x2_to_half2(r4[3] >> 16)};
          mma_16816(sc[m], a0, qb[2 * s2]);
          mma_16816(sc[m], a1, qb[2 * s2 + 1]);
        }
      } else {
#pragma unroll
        for (int s = 0; s < KS; ++s) {
          std::uint32_t af[4];
          ldmatrix_x4(af, krow + s * 32);
          // ldmatrix order: (rows 0-7, k 0-7) (rows 8-15, k 0-7) (rows 0-7, k 8-15) (8-15, 8-15)
          // kPair: the columns 0-3 only (4-7 would be the same heads again)
          const std::uint32_t bq[2] = {qb[s][0] & lo_cols, qb[s][1] & lo_cols};
          mma_16816(sc[m], af, bq);
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r)
        if (16 * (mw + m) + g + 8 * (r >> 1) >= n || (kPair && c >= 2)) sc[m][r] = -INFINITY;
    }
    float alpha[2];
    detail::online_softmax<kMTw, kPair>(sc, m_run, l_run, alpha);
#pragma unroll
    for (int mt = 0; mt < KS; ++mt)
#pragma unroll
      for (int r = 0; r < 4; ++r) o[mt][r] *= alpha[r & 1];
#pragma unroll
    for (int m = 0; m < kMTw; ++m) {
      std::uint32_t pb[2] = {movmatrix_trans(pack_half2(sc[m][0], sc[m][1])),
                             movmatrix_trans(pack_half2(sc[m][2], sc[m][3]))};
      // V rows 16 m + 2c + {0, 1, 8, 9}; lane g reads channels g D/8 .. g D/8 + D/8 - 1
      const unsigned char* vrow =
          vs + (16 * (mw + m) + 2 * c) * T::kRowStride + g * (D / 8) * T::kElem;
      constexpr int kB = D / 8 * T::kElem;
      std::uint32_t u0[kB / 4], u1[kB / 4], u2[kB / 4], u3[kB / 4];
      lds_bytes<kB>(vrow, u0);
      lds_bytes<kB>(vrow + T::kRowStride, u1);
      lds_bytes<kB>(vrow + 8 * T::kRowStride, u2);
      lds_bytes<kB>(vrow + 9 * T::kRowStride, u3);
#pragma unroll
      for (int mt = 0; mt < KS; ++mt) {
        std::uint32_t af[4];
        if constexpr (F == KvFormat::kFp8) {
          const int q = 2 * (mt % 2);
          const std::uint32_t sel = q | ((4 + q) << 4) | ((q + 1) << 8) | ((5 + q) << 12);
          const std::uint32_t x0 = __byte_perm(u0[mt / 2], u1[mt / 2], sel);
          const std::uint32_t x1 = __byte_perm(u2[mt / 2], u3[mt / 2], sel);
          af[0] = e4m3x2_to_half2(x0);
          af[1] = e4m3x2_to_half2(x0 >> 16);
          af[2] = e4m3x2_to_half2(x1);
          af[3] = e4m3x2_to_half2(x1 >> 16);
        } else {
          af[0] = __byte_perm(u0[mt], u1[mt], 0x5410);
          af[1] = __byte_perm(u0[mt], u1[mt], 0x7632);
          af[2] = __byte_perm(u2[mt], u3[mt], 0x5410);
          af[3] = __byte_perm(u2[mt], u3[mt], 0x7632);
        }
        mma_16816(o[mt], af, pb);
      }
    }
  };

  // ---------------- pipeline ----------------
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (more()) issue();
    cp_async_commit();
  }
  load_query();  // after the first copies: its latency hides behind theirs
  for (int it = 0; it < issued; ++it) {
    cp_async_wait<kStages - 2>();
    // Makes every thread's copies of stage `it` visible, and (kWarps > 1) guarantees that all
    // warps are done with the stage the next issue overwrites (the one processed at it - 1).
    if constexpr (T::kWarps > 1) {
      __syncthreads();
    } else {
      __syncwarp();
    }
    if (more()) issue();
    cp_async_commit();
    const int stage = it % kStages;
    const int4 d = desc[stage];
    const unsigned char* st = stages + stage * a.stage_bytes;
    if (F == KvFormat::kKvarn && d.x) {
      mbar_wait(&bars[stage], (bar_phase >> stage) & 1u);
      bar_phase ^= 1u << stage;
      if (!kPieces) {
        process_keys(st, d.w, sc_item);
        process_values(st, 0, sc_item);
      } else if (d.x == 1) {
        process_keys(st, d.w, sc_item);
      } else {
        process_values(st, a.v_codes, sc_item);
      }
    } else {
      process_rows(st, d.w);
    }
    if constexpr (T::kWarps == 1) __syncwarp();
  }
  cp_async_wait<0>();

  // ---- write the split's normalized output and lse (heads 2c, 2c + 1) ----
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int o2 = kPair ? 2 : 4; o2 < 32; o2 <<= 1)
      l_run[k] += __shfl_xor_sync(0xffffffffu, l_run[k], o2);
  // Two warps: one workspace split per CTA (half the partial outputs for the combine to read).
  if constexpr (T::kWarps == 2) {
    __syncthreads();  // every warp is done with the stages, which now carry the hand-over
    if (!detail::merge_warp_pair<KS>(reinterpret_cast<float*>(stages), warp, lane, o, m_run,
                                     l_run)) {
      grid_dep_launch();
      return;
    }
  }
  if constexpr (kPair) detail::add_pair_cols<KS>(o);  // lanes c < 2 write (qpk <= 4)
  const float vscale = F == KvFormat::kFp8 ? a.v_scale[h] : 1.0f;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int head = 2 * c + k;
    if (head >= a.qpk) continue;
    const long long row = static_cast<long long>(b) * a.num_q_heads + h * a.qpk + head;
    const float l = l_run[k];
    const float inv = l > 0.0f ? vscale / l : 0.0f;
    const long long ws = row * a.num_splits + split;
    float* dst = a.o_part + ws * D + g * (D / 8);
#pragma unroll
    for (int i = 0; i < D / 8; i += 4) {
      float4 v;
      v.x = o[i / 2][k] * inv;
      v.y = o[i / 2][2 + k] * inv;
      v.z = o[i / 2 + 1][k] * inv;
      v.w = o[i / 2 + 1][2 + k] * inv;
      *reinterpret_cast<float4*>(dst + i) = v;
    }
    if (g == 0) a.lse[ws] = l > 0.0f ? m_run[k] + log2f(l) : -INFINITY;
  }
  grid_dep_launch();
}

namespace detail {
// Inverse rotation (scaled FWHT; rot_scale 0: none) of the combined row, then its fp16 store.
// Every thread of the CTA calls it (it holds barriers); thread d < D owns channel d, value v.
// Butterflies within a warp by shuffles, across warps through x[D] in shared memory (two
// barriers per stage of 32 or more channels instead of one barrier per stage); the same
// additions, in the same order, as the FWHT through shared memory.
template <int D>
__device__ __forceinline__ void unrotate_store(float v, int d, float rot_scale, float* x,
                                               __half* out) {
  static_assert(D % 32 == 0, "warps own whole runs of channels");
  if (rot_scale != 0.0f) {
#pragma unroll
    for (int hs = 1; hs < 32; hs <<= 1) {
      const float p = __shfl_xor_sync(0xffffffffu, v, hs);
      v = (d & hs) ? p - v : v + p;
    }
#pragma unroll
    for (int hs = 32; hs < D; hs <<= 1) {
      if (d < D) x[d] = v;
      __syncthreads();
      if (d < D) {
        const float p = x[d ^ hs];
        v = (d & hs) ? p - v : v + p;
      }
      __syncthreads();
    }
    v *= rot_scale;
  }
  if (d < D) out[d] = __float2half_rn(v);
}
}  // namespace detail

// Combine the splits (log-sum-exp in the exp2 domain), un-rotate, write fp16.
// grid (Hq, batch), D threads; launched as a programmatic dependent of the split kernel.
// The first kCombineChunk splits' lse and partial outputs are loaded at once (one round trip to
// L2 instead of one per few splits); the host takes combine_wide_kernel from 17 to
// kCombineMaxSplits splits, and past that this kernel's loop does the rest.
constexpr int kCombineChunk = 16;
template <int D>
__global__ void __launch_bounds__(D)
    combine_kernel(const float* o_part, const float* lse, int num_q_heads, int num_splits,
                   float rot_scale, __half* out) {
  __shared__ float x[D];
  grid_dep_wait();
  const long long row = static_cast<long long>(blockIdx.y) * num_q_heads + blockIdx.x;
  const int d = threadIdx.x;
  const float* l = lse + row * num_splits;
  const float* op = o_part + row * num_splits * D + d;
  float lv[kCombineChunk], ov[kCombineChunk];
#pragma unroll
  for (int i = 0; i < kCombineChunk; ++i) {
    lv[i] = i < num_splits ? l[i] : -INFINITY;
    ov[i] = i < num_splits ? op[static_cast<long long>(i) * D] : 0.0f;
  }
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kCombineChunk; ++i) mx = fmaxf(mx, lv[i]);
  for (int s = kCombineChunk; s < num_splits; ++s) mx = fmaxf(mx, l[s]);
  float num = 0.0f, den = 0.0f;
  if (mx != -INFINITY) {
#pragma unroll
    for (int i = 0; i < kCombineChunk; ++i) {
      if (i < num_splits) {
        const float w = exp2f(lv[i] - mx);
        num += w * ov[i];
        den += w;
      }
    }
    for (int s = kCombineChunk; s < num_splits; ++s) {
      const float w = exp2f(l[s] - mx);
      num += w * op[static_cast<long long>(s) * D];
      den += w;
    }
  }
  detail::unrotate_store<D>(den > 0.0f ? num / den : 0.0f, d, rot_scale, x, out + row * D);
}

// The combine over many splits (batch 1 at long context, up to kCombineMaxSplits per row), one CTA
// of kCombineThreads per row: the split weights go to shared memory once, then thread t sums the
// float4 column t % (D / 4) of every (kCombineThreads / (D / 4))-th split (loads independent of
// each other, 16 bytes wide), and the column sums meet in shared memory. Same result as
// combine_kernel up to the order of the float additions.
constexpr int kCombineThreads = 256;
constexpr int kCombineMaxSplits = 2048;
template <int D>
__global__ void __launch_bounds__(kCombineThreads)
    combine_wide_kernel(const float* o_part, const float* lse, int num_q_heads, int num_splits,
                        float rot_scale, __half* out) {
  constexpr int kQuads = D / 4, kLanes = kCombineThreads / kQuads, kWarpsC = kCombineThreads / 32;
  __shared__ float w[kCombineMaxSplits];
  __shared__ float red[2][kWarpsC];
  __shared__ float4 part[kLanes][kQuads];
  __shared__ float x[D];
  grid_dep_wait();
  const long long row = static_cast<long long>(blockIdx.y) * num_q_heads + blockIdx.x;
  const int t = threadIdx.x, lane = t & 31, wid = t >> 5;
  const float* l = lse + row * num_splits;
  float mx = -INFINITY;
  for (int s = t; s < num_splits; s += kCombineThreads) {
    const float v = l[s];
    w[s] = v;
    mx = fmaxf(mx, v);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red[0][wid] = mx;
  __syncthreads();
  mx = red[0][0];
#pragma unroll
  for (int i = 1; i < kWarpsC; ++i) mx = fmaxf(mx, red[0][i]);
  float den = 0.0f;
  for (int s = t; s < num_splits; s += kCombineThreads) {
    const float e = mx == -INFINITY ? 0.0f : exp2f(w[s] - mx);
    w[s] = e;
    den += e;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
  if (lane == 0) red[1][wid] = den;
  __syncthreads();  // also publishes w
  den = 0.0f;
#pragma unroll
  for (int i = 0; i < kWarpsC; ++i) den += red[1][i];
  const int q = t % kQuads, sl = t / kQuads;
  const float4* op = reinterpret_cast<const float4*>(o_part + row * num_splits * D) + q;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int s = sl; s < num_splits; s += kLanes) {
    const float ws = w[s];
    const float4 v = op[static_cast<long long>(s) * kQuads];
    acc.x += ws * v.x;
    acc.y += ws * v.y;
    acc.z += ws * v.z;
    acc.w += ws * v.w;
  }
  part[sl][q] = acc;
  __syncthreads();
  const int d = t;
  float v = 0.0f;
  if (d < D) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kLanes; ++j) {
      const float4 p = part[j][d / 4];
      sum += (d % 4 == 0) ? p.x : (d % 4 == 1) ? p.y : (d % 4 == 2) ? p.z : p.w;
    }
    v = den > 0.0f ? sum / den : 0.0f;
  }
  detail::unrotate_store<D>(v, d, rot_scale, x, out + row * D);
}

}  // namespace kvarn::cuda

#endif  // KVARN_CUDA_DECODE_CUH_
