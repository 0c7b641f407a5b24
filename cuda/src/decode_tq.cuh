// Paged decode attention over a TurboQuant cache (vLLM presets turboquant_4bit_nc, _3bit_nc,
// _k8v4) on tensor cores, split-K with the log-sum-exp combine of decode.cuh.
//
// Cache (one layer): bytes [num_blocks, Hkv, P, slot], one vLLM per-token slot per (token, head):
//   key:   k = 3/4: LSB-first index stream ceil(D k / 8) bytes + fp16 norm; k = 8: D e4m3 bytes
//   value: LSB-first code stream D v / 8 bytes + fp16 scale + fp16 zero (min); slot rounded even.
// (vLLM keeps the same slot bytes token-major within a block, [block, P, Hkv, slot]; head-major
// pages keep the 16-token runs of one head contiguous and 16-byte aligned for cp.async.)
// Score (exp2 domain): s_t = norm_t * nc_t * <q H / sqrt(D), c[idx_t]> with
//   nc_t = 1 / sqrt(sum_d c[idx_td]^2 + 1e-16) (norm correction, computed here: the slot has no
//   room for it); k = 8: s_t = <q, fp8(k_t)> (no rotation). Values are never rotated:
//   O[h, d] = sum_t p[h, t] (q_td s_t + z_t) = sum_t p''[h, t] q_td + sum_t p[h, t] z_t,
//   p'' = p * s_t (fp16). The output is not un-rotated.
// Work item: 16 tokens of one page (16 * slot bytes, copied verbatim into one of kStages stages:
// a full item by one bulk copy (cp.async.bulk) completing on the stage's mbarrier, the partial
// last item of a sequence by cp.async with the bytes past it zero-filled). One warp per split,
// lane = 4 g + c; W (1, 4 or 8) such warps per CTA, each with its own stages and mbarriers, take
// W consecutive (sequence, KV head, split) streams and share the centroid pair table, which the
// whole CTA fills once (one block barrier): the table's shared memory is paid once per W warps.
// The output rescale of an item is skipped when no running max grew (alpha = 1).
//   QK^T: A = centroids [tokens g, g + 8 (M) x channels (k)], B = q'^T, C = S^T. Lane c owns
//     the channels [c D/4, (c + 1) D/4): k-step s, A/B element e <-> channel c D/4 + 4 s + e
//     (so a lane reads one 16-bit word of 4-bit indices per k-step and token). 4-bit indices
//     become fp16 centroids in registers: the 16 fp16 centroids are split into a low-byte and a
//     high-byte plane held in 4 registers, prmt looks up four codes at once (bit 3 of a code
//     selects the plane half through a prmt sign-replicate mask). 3-bit indices: a shared-memory
//     table maps the 6 bits of two adjacent channels to their half2 of centroids (64 entries,
//     32 copies interleaved word by word, 8 KB; lane l reads copy l, one bank per lane), so two
//     adjacent A elements are one funnel shift, one mask, one add and one 32-bit load, against
//     ~10 shift / lop3 / prmt for the planes (H200, batch 8-32 x 16K-32K: 1.10-1.12x faster
//     despite 12 instead of 18 resident CTAs per SM). The same table for 4-bit indices (256
//     entries) with one warp per CTA lost at batch 8-32 (8 or 16 copies, so lanes share banks:
//     0.94-1.01x with 8 copies, 0.76-0.98x with 16: fewer CTAs per SM and bank conflicts); with
//     eight warps sharing it, it has its 32 copies (32 KB) and 16 warps per SM (tq_uses_table).
//     The lane's copy offset 4 l joins the masked entry offset by the same lop3.
//     Norm correction: sum_d c^2 per token by one extra mma per k-step on hmul2(A, A) against
//     a ones B fragment (rows = tokens, all columns equal); a template parameter (NC), so the
//     kernel without it carries no branch.
//   PV: A = value codes^T [channels (M) x tokens (k)], B = P''^T (movmatrix of S^T). A code
//     field enters the mma as the fp16 subnormal its masked bits already are (codes_sub: one
//     and, no exponent, no hfma2): c 2^(e VB) 2^-24 exactly, which the tensor cores multiply
//     exactly like any fp16 (no offset to cancel, so no precision is lost in the fp32 sums); the
//     output rows of field e are scaled by 2^(24 - e VB) once, at the end. Row e of an M-tile
//     holds channel g D/8 + 2 mt + e, code field e of a byte pair. 3-bit codes at D 128: 16-bit
//     windows of both tokens side by side (v3_pair_window), one prmt per two M-tiles instead of two
//     funnel shifts and a prmt per tile. (Keeping 1024 + c in the operand and subtracting 1024 sum
//     p'' at the end cost 1.7e-5 NMSE here: O accumulates across all items of a split.)
#ifndef KVARN_CUDA_DECODE_TQ_CUH_
#define KVARN_CUDA_DECODE_TQ_CUH_

#include "decode.cuh"
#include "kvarn/cuda/decode_instances.hpp"

namespace kvarn::cuda {

struct TqDecodeArgs {
  const __half* q;
  const int* block_table;
  int max_blocks;
  const int* seq_lens;
  const unsigned char* cache;  // [num_blocks, Hkv, P, slot]
  int batch, num_q_heads, num_kv_heads, qpk, num_splits;
  int page;         // P (multiple of 16)
  float qk_scale;   // softmax scale * log2(e)
  float rot_scale;  // 1/sqrt(D) (Lloyd-Max keys) or 0 (fp8 keys)
  int nc;           // norm correction
  // fp16 centroid byte planes: byte i of lo[] / hi[] = low / high byte of centroid i
  std::uint32_t tab_lo[4], tab_hi[4];
  float* o_part;
  float* lse;
};

// Launch shape of W warps per CTA, each its own split (item stream, stages, mbarriers); the
// CTA's warps share the key centroid pair table, filled once. Host and device use these.
constexpr int tq_stages(int warps) { return warps == 1 ? 6 : warps == 4 ? 5 : 4; }
// resident CTAs per SM the registers must allow (__launch_bounds__)
constexpr int tq_min_ctas(int warps) { return warps == 1 ? 16 : warps == 4 ? 5 : 2; }
// Key centroids from the shared-memory pair table (see the header comment): 3-bit keys always;
// 4-bit keys (256 entries, 32 KB) where eight warps share it.
constexpr bool tq_uses_table(int key_bits, int warps) {
  return key_bits == 3 || (key_bits == 4 && warps >= 8);
}
constexpr int kTqTabRep = 32;  // copies: lane l reads copy l, so every lane has its own bank
constexpr int tq_table_bytes(int key_bits, int warps) {
  return tq_uses_table(key_bits, warps) ? (1 << (2 * key_bits)) * kTqTabRep * 4 : 0;
}
constexpr int tq_stage_bytes(int slot) { return (16 * slot + 127) / 128 * 128; }
// [table][per warp: 128-byte header (item sizes, mbarriers), its stages]
constexpr int tq_smem_bytes(int slot, int key_bits, int warps) {
  return tq_table_bytes(key_bits, warps) + warps * (128 + tq_stages(warps) * tq_stage_bytes(slot));
}

template <int D, int KB, int VB, int W = 1>
struct TqTraits {
  static constexpr int kKSteps = D / 16;
  static constexpr int kIdxBytes = KB == 8 ? D : D * KB / 8;
  static constexpr int kKeyBytes = KB == 8 ? D : kIdxBytes + 2;
  static constexpr int kVCodeBytes = D * VB / 8;
  static constexpr int kSlot = (kKeyBytes + kVCodeBytes + 4 + 1) / 2 * 2;
  static constexpr int kItemBytes = 16 * kSlot;
  static constexpr int kStageBytes = tq_stage_bytes(kSlot);
  static constexpr int kStages = tq_stages(W);
  static constexpr int kMinCtas = tq_min_ctas(W);
  static constexpr bool kTab = tq_uses_table(KB, W);
  static constexpr int kTabRep = kTqTabRep;
  static constexpr int kTabBytes = tq_table_bytes(KB, W);
  static constexpr int kWarpBytes = 128 + kStages * kStageBytes;
  static constexpr int kSmemBytes = tq_smem_bytes(kSlot, KB, W);
  static_assert(D % 64 == 0 && (KB == 3 || KB == 4 || KB == 8) && (VB == 3 || VB == 4), "tq");
};

namespace detail {

// 16-bit little-endian word at an even shared-memory address.
__device__ __forceinline__ std::uint32_t lds_u16(const unsigned char* p) {
  return *reinterpret_cast<const unsigned short*>(p);
}
// kBytes (even) from an even shared address into 32-bit words (LSB-first bit string).
template <int kBytes>
__device__ __forceinline__ void lds_even(const unsigned char* p, std::uint32_t (&w)[(kBytes + 3) / 4]) {
#pragma unroll
  for (int i = 0; i < kBytes / 2; i += 2) {
    const std::uint32_t lo = lds_u16(p + 2 * i);
    w[i / 2] = i + 1 < kBytes / 2 ? __byte_perm(lo, lds_u16(p + 2 * i + 2), 0x5410) : lo;
  }
}
// Bits [bit, bit + 32) of the LSB-first string w (bit a compile-time constant after unrolling).
template <int N>
__device__ __forceinline__ std::uint32_t bits_at(const std::uint32_t (&w)[N], int bit) {
  const int i = bit / 32, sh = bit % 32;
  if (sh == 0) return w[i];
  return i + 1 < N ? __funnelshift_r(w[i], w[i + 1], sh) : w[i] >> sh;
}
// Four 3-bit codes (bits 0..11 of x) -> nibbles 0..3 (bit 3 of each nibble clear).
__device__ __forceinline__ std::uint32_t spread3(std::uint32_t x) {
  return (x & 0x7u) | ((x << 1) & 0x70u) | ((x << 2) & 0x700u) | ((x << 3) & 0x7000u);
}
// Four codes (nibbles 0..3 of x; 16 entries, or 8 with bit 3 clear) -> fp16 centroids of
// channels +0, +1 (a02[0]) and +2, +3 (a02[1]).
template <int KB>
__device__ __forceinline__ void centroids4(std::uint32_t x, const std::uint32_t (&lo_t)[4],
                                           const std::uint32_t (&hi_t)[4], std::uint32_t& a0,
                                           std::uint32_t& a2) {
  std::uint32_t lo, hi;
  if constexpr (KB == 4) {
    const std::uint32_t j = x & 0x7777u;
    // 0xff bytes where bit 3 is set: prmt's sign-replicate selectors (bit 3 of a selector
    // nibble; __byte_perm drops it, hence the inline PTX)
    std::uint32_t m;
    asm("prmt.b32 %0, %1, %2, 0x9D8C;\n" : "=r"(m) : "r"(x), "r"(x << 4));
    const std::uint32_t l0 = __byte_perm(lo_t[0], lo_t[1], j), l1 = __byte_perm(lo_t[2], lo_t[3], j);
    const std::uint32_t h0 = __byte_perm(hi_t[0], hi_t[1], j), h1 = __byte_perm(hi_t[2], hi_t[3], j);
    lo = (l0 & ~m) | (l1 & m);
    hi = (h0 & ~m) | (h1 & m);
  } else {
    lo = __byte_perm(lo_t[0], lo_t[1], x);
    hi = __byte_perm(hi_t[0], hi_t[1], x);
  }
  a0 = __byte_perm(lo, hi, 0x5140);
  a2 = __byte_perm(lo, hi, 0x7362);
}
// fp16 bits of centroid i (run-time i < 16) from the byte planes.
__device__ __forceinline__ std::uint32_t centroid_bits(int i, const std::uint32_t (&lo_t)[4],
                                                       const std::uint32_t (&hi_t)[4]) {
  const std::uint32_t sel = static_cast<std::uint32_t>(i & 7);
  // (constant register indices: a run-time index would put the planes in local memory)
  const std::uint32_t lo =
      i < 8 ? __byte_perm(lo_t[0], lo_t[1], sel) : __byte_perm(lo_t[2], lo_t[3], sel);
  const std::uint32_t hi =
      i < 8 ? __byte_perm(hi_t[0], hi_t[1], sel) : __byte_perm(hi_t[2], hi_t[3], sel);
  return (lo & 0xffu) | ((hi & 0xffu) << 8);
}
// Fills the replicated pair table (TqTraits::kTab*): 16-byte stores of four copies of an entry,
// thread t of kThreads.
template <int KB, int kRep, int kThreads>
__device__ __forceinline__ void fill_pair_table(std::uint32_t* tab, const std::uint32_t (&lo_t)[4],
                                                const std::uint32_t (&hi_t)[4], int t) {
  constexpr int kEntries = 1 << (2 * KB), kVecs = kEntries * kRep / 4;
  for (int v = t; v < kVecs; v += kThreads) {
    const int e = v * 4 / kRep;
    const std::uint32_t w =
        centroid_bits(e & ((1 << KB) - 1), lo_t, hi_t) | (centroid_bits(e >> KB, lo_t, hi_t) << 16);
    *reinterpret_cast<uint4*>(tab + 4 * v) = make_uint4(w, w, w, w);
  }
}
__device__ __forceinline__ std::uint32_t lds_u32(const unsigned char* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}
// Byte offset in the pair table of the 2 KB index bits at bit p of the lane's string w: the
// field shifted straight to the entry stride (4 kRep bytes) by one funnel shift and masked.
template <int KB, int kRep, int N>
__device__ __forceinline__ std::uint32_t entry_offset(const std::uint32_t (&w)[N], int p) {
  constexpr int kS = kRep == 32 ? 7 : kRep == 16 ? 6 : kRep == 8 ? 5 : -1;  // log2(4 kRep)
  static_assert(kS > 0, "table stride: 8, 16 or 32 copies");
  constexpr std::uint32_t kMask = ((1u << (2 * KB)) - 1u) << kS;
  return (p >= kS ? bits_at(w, p - kS) : w[0] << (kS - p)) & kMask;
}
// 3-bit value codes, six bytes (16 channels) per token: bits [6 mt, 6 mt + 6) of tokens a (low
// half) and b (high half) at bits 0..5 and 16..21, from 16-bit windows of both tokens side by
// side (one prmt serves two M-tiles; each tile then at a shift below 11 within its window). mt is
// a constant after unrolling, so the unused windows fold away.
__device__ __forceinline__ std::uint32_t v3_pair_window(const std::uint32_t (&a)[2],
                                                        const std::uint32_t (&b)[2], int mt) {
  switch (mt) {
    case 0:
      return __byte_perm(a[0], b[0], 0x5410);  // bits 0..15
    case 1:
      return __byte_perm(a[0], b[0], 0x5410) >> 6;
    case 2:
      return __byte_perm(a[0], b[0], 0x6521) >> 4;  // bits 8..23
    case 3:
      return __byte_perm(a[0], b[0], 0x7632) >> 2;  // bits 16..31
    case 4:
      return __byte_perm(a[0], b[0], 0x7632) >> 8;
    case 5:  // bits 24..39
      return __byte_perm(__funnelshift_r(a[0], a[1], 24), __funnelshift_r(b[0], b[1], 24),
                         0x5410) >>
             6;
    case 6:
      return __byte_perm(a[1], b[1], 0x5410) >> 4;  // bits 32..47
    default:
      return __byte_perm(a[1], b[1], 0x5410) >> 10;
  }
}
__device__ __forceinline__ std::uint32_t hmul2_u32(std::uint32_t a) {
  const __half2 h = as_half2(a);
  return half2_bits(__hmul2(h, h));
}

}  // namespace detail

// NC: norm correction (a.nc) as a compile-time flag (Lloyd-Max keys only). W warps per CTA: warp
// w works item stream blockIdx.x * W + w of the batch x Hkv x num_splits streams (split fastest),
// so CTAs stay full whatever the split count; the streams past the last only help fill the table.
// kPair (at most 4 query heads per KV head): two items per step, A and B. Every QK mma is the same
// as alone (B's columns 4-7 repeat the heads of 0-3), but a lane keeps only its half of the score
// columns: c < 2 item A's, c >= 2 item B's, so the norm scaling, the softmax, p'' and sum p z run
// once per two items; PV takes P'' with the other item's columns zeroed, and the two column
// halves of O (lanes c, c ^ 2) are added once at the end. Every stage is filled before the first
// step (a step frees its two stages at its end), so kStages - 2 items are ahead of a step.
template <int D, int KB, int VB, bool NC, int W, bool kPair = false>
__global__ void __launch_bounds__(32 * W, TqTraits<D, KB, VB, W>::kMinCtas)
    paged_decode_tq_kernel(TqDecodeArgs a) {
  static_assert(!NC || KB != 8, "norm correction needs Lloyd-Max keys");
  static_assert(!kPair || kPairHeads == 4, "kPair: heads g & 3, halves c < 2 and c >= 2");
  using T = TqTraits<D, KB, VB, W>;
  constexpr int KS = T::kKSteps;
  constexpr bool TAB = T::kTab;  // key centroids from the shared-memory pair table
  constexpr std::uint32_t kOnes = 0x3C003C00u;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // full items (16 tokens) arrive by one bulk copy completing on the stage's mbarrier
  static_assert(T::kStages <= 8 && T::kItemBytes % 16 == 0 && T::kTabBytes % 128 == 0, "tq smem");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  unsigned char* wsm = smem_raw + T::kTabBytes + warp * T::kWarpBytes;
  int* desc = reinterpret_cast<int*>(wsm);  // [kStages] valid tokens of the item
  std::uint64_t* bars = reinterpret_cast<std::uint64_t*>(wsm + 64);
  unsigned char* stages = wsm + 128;

  const int stream = blockIdx.x * W + warp, per_seq = a.num_kv_heads * a.num_splits;
  const bool live = stream < a.batch * per_seq;
  const int b = live ? stream / per_seq : 0, hs = stream - b * per_seq;
  const int h = live ? hs / a.num_splits : 0, split = live ? hs - h * a.num_splits : a.num_splits;
  const int P = a.page;
  if (lane == 0)
#pragma unroll
    for (int i = 0; i < T::kStages; ++i) mbar_init(&bars[i], 1);
  __syncwarp();
  unsigned bar_phase = 0;  // bit i: parity of the next phase of bars[i] to wait for
  // (a stream past the last has split num_splits: no blocks)
  const SplitBlocks range =
      split_blocks(a.seq_lens, a.block_table, a.max_blocks, P, a.num_splits, split, b);
  const int len = range.len, j_begin = range.j_begin, j_end = range.j_end;
  const int* table = range.table;

  // ---- query: head g (kPair: g & 3), channel c D/4 + 4 s + e; rotate (FWHT over the channel
  // bits); scale ----
  float qf[KS][4];
  {
    const int qh = kPair ? (g & 3) : g;
    const bool live = qh < a.qpk;
    const __half* qrow = a.q + (static_cast<long long>(b) * a.num_q_heads + h * a.qpk + qh) * D;
#pragma unroll
    for (int s = 0; s < KS; ++s)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        float2 v = make_float2(0.0f, 0.0f);
        if (live)
          v = __half22float2(*reinterpret_cast<const __half2*>(qrow + c * (D / 4) + 4 * s + e));
        qf[s][e] = v.x;
        qf[s][e + 1] = v.y;
      }
    // butterflies on bit e0, c (lanes), e1, s: the same set as the channel bits
    if (a.rot_scale != 0.0f) fwht_fragments<KS>(qf, c);
    const float scale = (a.rot_scale != 0.0f ? a.rot_scale : 1.0f) * a.qk_scale;
#pragma unroll
    for (int s = 0; s < KS; ++s)
#pragma unroll
      for (int e = 0; e < 4; ++e) qf[s][e] *= scale;
  }
  std::uint32_t qb[KS][2];
#pragma unroll
  for (int s = 0; s < KS; ++s) {
    qb[s][0] = pack_half2(qf[s][0], qf[s][1]);
    qb[s][1] = pack_half2(qf[s][2], qf[s][3]);
  }
  std::uint32_t lo_t[4], hi_t[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lo_t[i] = a.tab_lo[i];
    hi_t[i] = a.tab_hi[i];
  }
  // TAB: the pair table at the start of shared memory; lane l reads copy l (its byte offset
  // 4 l is below the entry stride, so it joins the entry offset by an or)
  const std::uint32_t lane4 = 4u * static_cast<std::uint32_t>(lane % T::kTabRep);

  float o[KS][4];
#pragma unroll
  for (int i = 0; i < KS; ++i)
#pragma unroll
    for (int r = 0; r < 4; ++r) o[i][r] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  float pz[2] = {0.0f, 0.0f};              // lane partial of sum_t p z_t (tokens g, g + 8)

  // ---- producer: item (block pj, rows prow..) into stage pst ----
  int win_base = -1000000, win = 0;
  auto block_phys = [&](int j) {
    if (j - win_base >= 32) {
      win_base = j;
      win = j + lane < j_end ? table[j + lane] : 0;
    }
    return __shfl_sync(0xffffffffu, win, j - win_base);
  };
  const int page_bytes = a.num_kv_heads * P * T::kSlot;  // one physical block of the cache
  const unsigned char* head_base = a.cache + static_cast<long long>(h) * P * T::kSlot;
  int pj = j_begin, prow = 0, pst = 0;
  auto issue = [&]() {
    const int n_blk = min(P, len - pj * P);
    const int n = min(16, n_blk - prow);
    const unsigned char* src =
        head_base + static_cast<long long>(block_phys(pj)) * page_bytes + prow * T::kSlot;
    unsigned char* dst = stages + pst * T::kStageBytes;
    if (n == 16) {  // a full item: contiguous and 16-byte aligned (P is a multiple of 16)
      if (lane == 0) {
        desc[pst] = 16;
        mbar_arrive_expect_tx(&bars[pst], T::kItemBytes);
        bulk_copy_g2s(dst, src, T::kItemBytes, &bars[pst]);
      }
    } else {  // the sequence's last, partial item: zero-fill the bytes past it
      const int valid = n * T::kSlot;
#pragma unroll 2
      for (int o16 = lane * 16; o16 < T::kItemBytes; o16 += 32 * 16)
        cp_async16(dst + o16, src + (o16 < valid ? o16 : 0), o16 < valid);
      if (lane == 0) desc[pst] = n;
    }
    prow += 16;
    if (prow >= n_blk) {
      ++pj;
      prow = 0;
    }
    pst = pst + 1 == T::kStages ? 0 : pst + 1;
  };

  // ---- S^T = centroids x q' (and, NC, the squared centroid sums) of the item in stage st ----
  auto qk = [&](const unsigned char* st, float(&sc)[4], float(&cs)[4]) {
    const unsigned char* k0 = st + g * T::kSlot;
    const unsigned char* k1 = k0 + 8 * T::kSlot;
    if constexpr (KB == 8) {
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        const int off = c * (D / 4) + 4 * s;
        const std::uint32_t w0 = *reinterpret_cast<const std::uint32_t*>(k0 + off);
        const std::uint32_t w1 = *reinterpret_cast<const std::uint32_t*>(k1 + off);
        const std::uint32_t af[4] = {e4m3x2_to_half2(w0), e4m3x2_to_half2(w1),
                                     e4m3x2_to_half2(w0 >> 16), e4m3x2_to_half2(w1 >> 16)};
        mma_16816(sc, af, qb[s]);
      }
    } else {
      constexpr int kLaneBytes = D / 4 * KB / 8;  // 32 channels: 16 (4-bit) / 12 (3-bit) bytes
      std::uint32_t w0[(kLaneBytes + 3) / 4], w1[(kLaneBytes + 3) / 4];
      detail::lds_even<kLaneBytes>(k0 + c * kLaneBytes, w0);
      detail::lds_even<kLaneBytes>(k1 + c * kLaneBytes, w1);
      const std::uint32_t ones_b[2] = {kOnes, kOnes};
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        std::uint32_t af[4];
        if constexpr (TAB) {  // byte offsets of the two pair entries straight from the bit string
          constexpr int kR = T::kTabRep;
          const int p0 = 4 * KB * s, p1 = p0 + 2 * KB;  // channels +0, +1 and +2, +3
          af[0] = detail::lds_u32(smem_raw + (detail::entry_offset<KB, kR>(w0, p0) | lane4));
          af[2] = detail::lds_u32(smem_raw + (detail::entry_offset<KB, kR>(w0, p1) | lane4));
          af[1] = detail::lds_u32(smem_raw + (detail::entry_offset<KB, kR>(w1, p0) | lane4));
          af[3] = detail::lds_u32(smem_raw + (detail::entry_offset<KB, kR>(w1, p1) | lane4));
        } else {
          std::uint32_t x0 = detail::bits_at(w0, 4 * KB * s), x1 = detail::bits_at(w1, 4 * KB * s);
          if constexpr (KB == 3) {
            x0 = detail::spread3(x0);
            x1 = detail::spread3(x1);
          }
          detail::centroids4<KB>(x0, lo_t, hi_t, af[0], af[2]);
          detail::centroids4<KB>(x1, lo_t, hi_t, af[1], af[3]);
        }
        mma_16816(sc, af, qb[s]);
        if constexpr (NC) {
          const std::uint32_t sq[4] = {detail::hmul2_u32(af[0]), detail::hmul2_u32(af[1]),
                                       detail::hmul2_u32(af[2]), detail::hmul2_u32(af[3])};
          mma_16816(cs, sq, ones_b);
        }
      }
    }
  };
  // ---- O^T += value codes^T x P'' of the item in stage st: tokens 2c, 2c + 1 (a[0], a[1]),
  // 2c + 8, 2c + 9 ----
  auto pv = [&](const unsigned char* st, const std::uint32_t(&pb)[2]) {
    constexpr int kLaneV = D / 8 * VB / 8;  // bytes of the lane's D/8 channels (8 / 6 / 4 / 3)
    constexpr int kLoadV = (kLaneV + 1) / 2 * 2;  // from the even address below voff
    static_assert(kLaneV % 2 == 0 || kLoadV <= 4, "odd lane bytes only for 3 bytes");
    const int voff = T::kKeyBytes + g * kLaneV;
    [[maybe_unused]] const int vsh = 8 * (voff & 1);
    std::uint32_t u[4][(kLoadV + 3) / 4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int t = 2 * c + (i & 1) + 8 * (i >> 1);
      detail::lds_even<kLoadV>(st + t * T::kSlot + (voff & ~1), u[i]);
      if constexpr (kLaneV % 2 != 0) u[i][0] >>= vsh;
    }
#pragma unroll
    for (int mt = 0; mt < KS; ++mt) {
      std::uint32_t af[4];
      if constexpr (VB == 4) {
        const std::uint32_t sel = detail::pair_sel(mt % 4);
        const std::uint32_t x0 = __byte_perm(u[0][mt / 4], u[1][mt / 4], sel);
        const std::uint32_t x1 = __byte_perm(u[2][mt / 4], u[3][mt / 4], sel);
        af[0] = codes_sub<4, 0>(x0);
        af[1] = codes_sub<4, 1>(x0);
        af[2] = codes_sub<4, 0>(x1);
        af[3] = codes_sub<4, 1>(x1);
      } else {
        std::uint32_t x0, x1;
        if constexpr (kLaneV == 6) {
          x0 = detail::v3_pair_window(u[0], u[1], mt);
          x1 = detail::v3_pair_window(u[2], u[3], mt);
        } else {
          x0 = __byte_perm(detail::bits_at(u[0], 6 * mt), detail::bits_at(u[1], 6 * mt), 0x5410);
          x1 = __byte_perm(detail::bits_at(u[2], 6 * mt), detail::bits_at(u[3], 6 * mt), 0x5410);
        }
        af[0] = codes_sub<3, 0>(x0);
        af[1] = codes_sub<3, 1>(x0);
        af[2] = codes_sub<3, 0>(x1);
        af[3] = codes_sub<3, 1>(x1);
      }
      mma_16816(o[mt], af, pb);
    }
  };
  // Scores, softmax and P V of one item (st, n valid tokens), or kPair of two (stb, nb: item B; the
  // lanes c >= 2 hold B's scores).
  auto process = [&](const unsigned char* st, int n, const unsigned char* stb, int nb) {
    float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, cs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    qk(st, sc, cs);
    const bool upper = kPair && c >= 2;
    if constexpr (kPair) {
      float scb[4] = {0.0f, 0.0f, 0.0f, 0.0f}, csb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      qk(stb, scb, csb);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        sc[r] = upper ? scb[r] : sc[r];
        cs[r] = upper ? csb[r] : cs[r];
      }
    }
    // the lane's item (kPair: A or B)
    const unsigned char* k0 = (upper ? stb : st) + g * T::kSlot;
    const unsigned char* k1 = k0 + 8 * T::kSlot;
    if (upper) n = nb;
    // ---- scores of tokens g (sc[0], sc[1]) and g + 8 (sc[2], sc[3]) ----
    if constexpr (KB != 8) {
      float f0 = __half2float(
          __ushort_as_half(static_cast<unsigned short>(detail::lds_u16(k0 + T::kIdxBytes))));
      float f1 = __half2float(
          __ushort_as_half(static_cast<unsigned short>(detail::lds_u16(k1 + T::kIdxBytes))));
      if constexpr (NC) {
        f0 *= rsqrtf(cs[0] + 1e-16f);
        f1 *= rsqrtf(cs[2] + 1e-16f);
      }
      sc[0] *= f0;
      sc[1] *= f0;
      sc[2] *= f1;
      sc[3] *= f1;
    }
    if (g >= n) sc[0] = sc[1] = -INFINITY;
    if (g + 8 >= n) sc[2] = sc[3] = -INFINITY;
    float sc2[1][4] = {{sc[0], sc[1], sc[2], sc[3]}};
    float alpha[2];
    detail::online_softmax<1, kPair>(sc2, m_run, l_run, alpha);
    // alpha is exactly 1 unless a running max grew: skip the rescale when no lane's did
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int mt = 0; mt < KS; ++mt)
#pragma unroll
        for (int r = 0; r < 4; ++r) o[mt][r] *= alpha[r & 1];
      pz[0] *= alpha[0];
      pz[1] *= alpha[1];
    }

    // ---- P'' = p * s_t; sum_t p z_t ----
    const float2 sz0 =
        unpack_half2(detail::lds_u16(k0 + T::kKeyBytes + T::kVCodeBytes) |
                     (detail::lds_u16(k0 + T::kKeyBytes + T::kVCodeBytes + 2) << 16));
    const float2 sz1 =
        unpack_half2(detail::lds_u16(k1 + T::kKeyBytes + T::kVCodeBytes) |
                     (detail::lds_u16(k1 + T::kKeyBytes + T::kVCodeBytes + 2) << 16));
    pz[0] += sc2[0][0] * sz0.y + sc2[0][2] * sz1.y;
    pz[1] += sc2[0][1] * sz0.y + sc2[0][3] * sz1.y;
    std::uint32_t pb[2] = {movmatrix_trans(pack_half2(sc2[0][0] * sz0.x, sc2[0][1] * sz0.x)),
                           movmatrix_trans(pack_half2(sc2[0][2] * sz1.x, sc2[0][3] * sz1.x))};

    if constexpr (kPair) {  // B fragment column n = g: lanes g < 4 carry item A's heads
      const std::uint32_t lo = g < 4 ? 0xffffffffu : 0u;
      const std::uint32_t pa[2] = {pb[0] & lo, pb[1] & lo}, pbb[2] = {pb[0] & ~lo, pb[1] & ~lo};
      pv(st, pa);
      pv(stb, pbb);
    } else {
      pv(st, pb);
    }
  };

  // ---- pipeline ----
  auto more = [&] { return pj < j_end; };
  int issued = 0;
  // kStages - 1 items ahead of the one in process; kPair: every stage, the two of a step free
  // only after it
#pragma unroll
  for (int i = 0; i < T::kStages - (kPair ? 0 : 1); ++i) {
    if (more()) {
      issue();
      ++issued;
    }
    cp_async_commit();
  }
  if constexpr (TAB) {  // while the first items are in flight; every warp of the CTA helps
    detail::fill_pair_table<KB, T::kTabRep, 32 * W>(reinterpret_cast<std::uint32_t*>(smem_raw),
                                                    lo_t, hi_t, threadIdx.x);
    if constexpr (W == 1) {
      __syncwarp();
    } else {
      __syncthreads();
    }
  }
  if (!live) return;  // after the table barrier
  int cst = 0;        // stage of item `it`
  auto next_stage = [](int st) { return st + 1 == T::kStages ? 0 : st + 1; };
  auto arrived = [&](int st) {  // valid tokens of the item in stage st, once its bytes are there
    const int n = desc[st];
    if (n == 16) {
      mbar_wait(&bars[st], (bar_phase >> st) & 1u);
      bar_phase ^= 1u << st;
    }
    return n;
  };
  auto refill = [&]() {
    if (more()) {
      issue();
      ++issued;
    }
    cp_async_commit();
  };
  if constexpr (kPair) {
    for (int it = 0; it < issued; it += 2) {
      cp_async_wait<T::kStages - 2>();  // kStages + it groups committed: items it, it + 1 in
      __syncwarp();
      const int sa = cst, sb = next_stage(cst);
      const bool has_b = it + 1 < issued;
      const int na = arrived(sa), nb = has_b ? arrived(sb) : 0;
      // a missing B: A's stage again with no valid token (finite bytes, p = 0)
      process(stages + sa * T::kStageBytes, na, stages + (has_b ? sb : sa) * T::kStageBytes, nb);
      __syncwarp();
      refill();
      refill();
      cst = next_stage(sb);
    }
  } else {
    for (int it = 0; it < issued; ++it) {
      cp_async_wait<T::kStages - 2>();
      __syncwarp();
      refill();
      const int n = arrived(cst);
      process(stages + cst * T::kStageBytes, n, nullptr, 0);
      __syncwarp();
      cst = next_stage(cst);
    }
  }
  cp_async_wait<0>();

  // ---- O = acc 2^(24 - e VB) (row e: code field e) + sum p z; normalize; write (heads 2c,
  // 2c + 1; kPair: lanes c < 2 after adding the column halves of lanes c ^ 2) ----
  constexpr float kUnsub0 = 16777216.0f, kUnsub1 = kUnsub0 / static_cast<float>(1 << VB);
  if constexpr (kPair) detail::add_pair_cols<KS>(o);
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int o2 = kPair ? 2 : 4; o2 < 32; o2 <<= 1) {
      l_run[k] += __shfl_xor_sync(0xffffffffu, l_run[k], o2);
      pz[k] += __shfl_xor_sync(0xffffffffu, pz[k], o2);
    }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int head = 2 * c + k;
    if (head >= a.qpk || (kPair && c >= 2)) continue;
    const long long row = static_cast<long long>(b) * a.num_q_heads + h * a.qpk + head;
    const float l = l_run[k];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float* dst = a.o_part + (row * a.num_splits + split) * D + g * (D / 8);
#pragma unroll
    for (int i = 0; i < D / 8; i += 4) {
      float4 v;
      v.x = fmaf(o[i / 2][k], kUnsub0, pz[k]) * inv;
      v.y = fmaf(o[i / 2][2 + k], kUnsub1, pz[k]) * inv;
      v.z = fmaf(o[i / 2 + 1][k], kUnsub0, pz[k]) * inv;
      v.w = fmaf(o[i / 2 + 1][2 + k], kUnsub1, pz[k]) * inv;
      *reinterpret_cast<float4*>(dst + i) = v;
    }
    if (g == 0) a.lse[row * a.num_splits + split] = l > 0.0f ? m_run[k] + log2f(l) : -INFINITY;
  }
  grid_dep_launch();
}

}  // namespace kvarn::cuda

#endif  // KVARN_CUDA_DECODE_TQ_CUH_
