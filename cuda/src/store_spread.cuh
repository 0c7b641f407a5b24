// KVarN store with each tile stream spread over a cluster of 8 CTAs: the same bytes as
// kvarn_store_kernel (store.cuh), in a fraction of its latency.
//
// Grid (num_tiles * 8, 2), cluster (8, 1, 1), blockIdx.y = stream (0 keys, 1 values),
// spread_threads<D, G>() = max(D, G) threads. Oriented tile R x C as in store.cuh.
//   CTA rank m owns the oriented rows r = m + 8 l (l < R / 8). Those are exactly the rows that
//   make partial m of every column statistic (reduce.hpp: lane m sums the elements i = m (mod 8)
//   in increasing i), so each CTA forms its partial of all C columns alone, thread c walking its
//   column, and the 8 partials meet in every CTA's shared memory (distributed shared memory,
//   one exchange round) for combine8's fixed tree. Row statistics never leave their CTA.
//   Per VarN iteration: R1-R3 as store.cuh with rows local, a row's scale in the registers of
//   its 8 lanes (each runs the same log / exp, no barrier) | column sums -> exchange |
//   column means, squared deviations -> exchange | column stds and the next s_col of every
//   column (each CTA computes all C, bit for bit alike) | imbalance from the exchanged row std
//   extremes. An exchange round is st.async stores into every CTA that complete on the
//   receiver's mbarrier (no cluster barrier); two rounds and two CTA barriers per iteration.
//   Rotation: CTA m rotates the tokens g = m + 8 i, 8 lanes per token, lane j holding the D / 64
//   groups of 8 channels 8 (NG j + b) + i: FWHT stages 1-4 in registers, stage 8 across the
//   lane's two groups (D 128), the rest across the 8 lanes by xor shuffles. That is the full
//   FWHT's stage order, so the fp32 mode rounds as the CPU and the fp16 mode's integer adds are
//   exact. Value rows are these tokens; a key's channel d goes to row d / 8 of CTA d mod 8.
//   Shared memory (floats): cur [R/8][C + 8], xh fp16 [R/8][C + 8], s_col / best / reciprocals
//   [4][C], the exchange buffers col_sum, col_var [8][C] and row extremes [2 parities][8][warps]
//   [2], column extremes [warps][2], the tile magnitudes [8][3].
#ifndef KVARN_CUDA_STORE_SPREAD_CUH_
#define KVARN_CUDA_STORE_SPREAD_CUH_

#include <cooperative_groups.h>

#include "store.cuh"

namespace kvarn::cuda {

constexpr int kStoreClusterSize = 8;  // = the 8 partials of reduce.hpp's canonical order

template <int D, int G>
constexpr int spread_threads() {
  return D > G ? D : G;
}

namespace detail {

namespace cg = cooperative_groups;

template <int R, int C, int T>
struct SpreadLayout {
  static constexpr int kRows = R / kStoreClusterSize;  // rows of this CTA
  static constexpr int kLd = C + 8;                    // fp32 / fp16 row pitch
  static constexpr int kWarps = T / 32;
  static constexpr int kCur = 0;
  static constexpr int kXh = kCur + kRows * kLd;
  static constexpr int kSc = kXh + kRows * kLd / 2;  // s_col, best_sc, rc, best_rc
  static constexpr int kColSum = kSc + 4 * C;
  static constexpr int kColVar = kColSum + kStoreClusterSize * C;
  static constexpr int kRowExt = kColVar + kStoreClusterSize * C;
  static constexpr int kColExt = kRowExt + 2 * kStoreClusterSize * kWarps * 2;
  static constexpr int kMag = kColExt + kWarps * 2;
  static constexpr int kFloats = kMag + kStoreClusterSize * 3;
  static_assert(kRows * kLd % 2 == 0 && (C + 16) <= 4 * kLd, "codes fit in cur");
};

// Cluster barrier: every thread of the 8 CTAs; shared-memory writes before it (local or remote)
// are visible after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
}

// Writes v to element i of the buffer at local address buf in every CTA of the cluster.
template <typename V>
__device__ __forceinline__ void broadcast(cg::cluster_group& cluster, V* buf, int i, V v) {
#pragma unroll
  for (int q = 0; q < kStoreClusterSize; ++q) cluster.map_shared_rank(buf, q)[i] = v;
}

// A buffer that every CTA of the cluster fills in every CTA's shared memory: pushes are st.async
// stores that complete on the receiver's mbarrier, which expects the bytes of one round (one
// expect_tx arrival per round), so a round costs one trip of the data, no cluster barrier.
struct Exchange {
  std::uint64_t* bar;
  // v to element i of buf in every CTA (buf: this CTA's copy).
  __device__ __forceinline__ void push(float* buf, int i, float v) const {
    const unsigned addr = smem_addr(buf + i), b = smem_addr(bar);
#pragma unroll
    for (int q = 0; q < kStoreClusterSize; ++q) {
      unsigned ra, rb;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(addr), "r"(q));
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rb) : "r"(b), "r"(q));
      asm volatile(
          "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(ra),
          "r"(__float_as_uint(v)), "r"(rb)
          : "memory");
    }
  }
  // Thread 0, once per round before waiting: the bytes this CTA receives in the round.
  __device__ __forceinline__ void expect(unsigned bytes) const {
    mbar_arrive_expect_tx(bar, bytes);
  }
  // Every thread: round `round` complete (its bytes visible).
  __device__ __forceinline__ void wait(int round) const { mbar_wait<true>(bar, round & 1); }
};

template <typename Acc>
__device__ __forceinline__ Acc load_acc(std::uint16_t h) {
  if constexpr (sizeof(Acc) == 8) {
    return half_to_fixed24(h);
  } else {
    return half_bits_to_float(h);
  }
}

template <typename Acc>
__device__ __forceinline__ std::uint16_t round_acc(const StoreArgs& a, Acc v) {
  if constexpr (sizeof(Acc) == 8) {
    return hadamard_fp16_bits(v, a.rot_c);
  } else {
    return half_bits_rn(a.hadamard ? v * a.rot_scale : v);
  }
}

// FWHT butterfly between lane j and lane j ^ s: the lower lane keeps x0 + x1, the upper x0 - x1.
template <typename Acc>
__device__ __forceinline__ Acc lane_butterfly(Acc v, int j, int s) {
  const Acc o = __shfl_xor_sync(0xffffffffu, v, s);
  return (j & s) ? o - v : v + o;
}

// The remaining FWHT stages of NG values per lane (index NG j + b): stage 8 inside the lane's
// groups (NG 2), then xor 1, 2, 4 across the 8 lanes.
template <int NG, typename Acc>
__device__ __forceinline__ void fwht_across(Acc (&w)[NG], int j) {
  if constexpr (NG == 2) {
    const Acc x0 = w[0], x1 = w[1];
    w[0] = x0 + x1;
    w[1] = x0 - x1;
  }
#pragma unroll
  for (int s = 1; s < 8; s <<= 1)
#pragma unroll
    for (int b = 0; b < NG; ++b) w[b] = lane_butterfly(w[b], j, s);
}

// Loads, rotates and rounds this CTA's tokens g = m + 8 i (module comment) into the rows of
// their owners: values rows are tokens (this CTA's own), keys rows are channels (channel d goes
// to CTA d mod 8, row d / 8, by a remote shared-memory store). Acc: long long for the published
// fp16 matrix (hadamard 2), float otherwise. Returns this thread's magnitudes of what it rounded.
template <int D, int G, bool IS_KEY, int T, int LD, typename Acc>
__device__ __forceinline__ Magnitudes spread_rotate(const StoreArgs& a, cg::cluster_group& cluster,
                                                    const std::uint16_t* in, int m,
                                                    std::uint16_t* xh) {
  constexpr int NG = D / 64;
  constexpr int kTokens = G / kStoreClusterSize;
  static_assert(kTokens % 4 == 0 && (T / 8) % 4 == 0, "whole warps per token pass");
  static_assert(kTokens <= T / 8, "one pass (the cluster wait below runs once)");
  const int j = threadIdx.x & 7, it = threadIdx.x >> 3;
  Magnitudes mag;
  Acc v[NG][8];
  const int g = m + kStoreClusterSize * it;
  if (it < kTokens) {
    const std::uint16_t* src = in + g * a.row_stride + 8 * NG * j;
#pragma unroll
    for (int b = 0; b < NG; ++b) {
      std::uint16_t xs[8];
      load8_halves(a, src + 8 * b, xs);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (a.hadamard == 2 && (xs[i] & 0x7c00u) == 0x7c00u && a.overflow)
          atomicExch(a.overflow, 1);
        v[b][i] = load_acc<Acc>(xs[i]);
      }
      if (a.hadamard) fwht8(v[b]);
    }
    if (a.hadamard) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        Acc w[NG];
#pragma unroll
        for (int b = 0; b < NG; ++b) w[b] = v[b][i];
        fwht_across<NG>(w, j);
#pragma unroll
        for (int b = 0; b < NG; ++b) v[b][i] = w[b];
      }
    }
  }
  // every CTA of the cluster runs (arrived at kernel start) before the first remote store
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
  if (it < kTokens) {
#pragma unroll
    for (int b = 0; b < NG; ++b)
#pragma unroll
      for (int i = 0; i < 8; ++i) {  // channel d = 8 (NG j + b) + i
        const std::uint16_t hb = round_acc(a, v[b][i]);
        if ((hb & 0x7c00u) == 0x7c00u && a.overflow) atomicExch(a.overflow, 1);
        mag.add(hb);
        if constexpr (IS_KEY) {
          cluster.map_shared_rank(xh, i)[(NG * j + b) * LD + g] = hb;
        } else {
          xh[it * LD + 8 * (NG * j + b) + i] = hb;
        }
      }
  }
  return mag;
}

// tile_divides_fast over the whole tile from every thread's magnitudes: CTA partials meet in
// every CTA's mag (the cluster barrier also completes the rotation's remote stores).
template <int T>
__device__ __forceinline__ bool spread_divides_fast(const StoreArgs& a, cg::cluster_group& cluster,
                                                    Magnitudes mg, unsigned* mag,
                                                    unsigned* warp_mag, int m) {
  mg.warp_reduce();
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) {
    warp_mag[3 * warp] = mg.lo;
    warp_mag[3 * warp + 1] = mg.hi;
    warp_mag[3 * warp + 2] = mg.bad;
  }
  __syncthreads();
  if (threadIdx.x < 3) {
    unsigned x = warp_mag[threadIdx.x];
    for (int w = 1; w < T / 32; ++w) {
      const unsigned y = warp_mag[3 * w + threadIdx.x];
      x = threadIdx.x == 0 ? min(x, y) : threadIdx.x == 1 ? max(x, y) : (x | y);
    }
    broadcast(cluster, mag, 3 * m + threadIdx.x, x);
  }
  cluster_sync();
  Magnitudes all;
#pragma unroll
  for (int q = 0; q < kStoreClusterSize; ++q) {
    Magnitudes o;
    o.lo = mag[3 * q];
    o.hi = mag[3 * q + 1];
    o.bad = mag[3 * q + 2];
    all.add(o);
  }
  return all.divides_fast(a);
}

// Shared-memory views of one CTA (SpreadLayout).
template <int R, int C, int T>
struct SpreadBufs {
  using L = SpreadLayout<R, C, T>;
  float* cur;
  std::uint16_t* xh;
  float *sc, *best_sc, *rc, *best_rc;
  float *col_sum, *col_var, *row_ext, *col_ext;
  unsigned* mag;
  __device__ explicit SpreadBufs(float* s)
      : cur(s + L::kCur),
        xh(reinterpret_cast<std::uint16_t*>(s + L::kXh)),
        sc(s + L::kSc),
        best_sc(sc + C),
        rc(sc + 2 * C),
        best_rc(sc + 3 * C),
        col_sum(s + L::kColSum),
        col_var(s + L::kColVar),
        row_ext(s + L::kRowExt),
        col_ext(s + L::kColExt),
        mag(reinterpret_cast<unsigned*>(s + L::kMag)) {}
};

// The 8 exchanged column partials of column c in combine8's order.
template <int C>
__device__ __forceinline__ float combine8_col(const float* parts, int c) {
  float p[kStoreClusterSize];
#pragma unroll
  for (int q = 0; q < kStoreClusterSize; ++q) p[q] = parts[q * C + c];
  return combine8(p);
}

// Column c's std over the whole tile (thread c; every CTA gets the same value): this CTA's
// partials (its rows, in increasing row order) meet the others' in two exchange rounds, `sums`
// (which also carries the row std extremes) and `vars`.
template <int R, int C, int T>
__device__ __forceinline__ float spread_col_std(const Exchange& sums, const Exchange& vars, int it,
                                                const SpreadBufs<R, C, T>& b, int m) {
  constexpr int RL = R / kStoreClusterSize, LD = C + 8;
  const int c = threadIdx.x;
  float p = 0.0f;
  if (c < C) {
#pragma unroll 4
    for (int l = 0; l < RL; ++l) p += b.cur[l * LD + c];
    sums.push(b.col_sum, m * C + c, p);
  }
  sums.wait(it);
  if (c < C) {
    const float mean = combine8_col<C>(b.col_sum, c) / static_cast<float>(R);
    p = 0.0f;
#pragma unroll 4
    for (int l = 0; l < RL; ++l) {
      const float dv = b.cur[l * LD + c] - mean;
      p += dv * dv;
    }
    vars.push(b.col_var, m * C + c, p);
  }
  vars.wait(it);
  return c < C ? sqrt_rn(combine8_col<C>(b.col_var, c) / static_cast<float>(R - 1)) : 0.0f;
}

// VarN, RTN of this CTA's rows, packing and scale absorption (module comment). A row's scale
// lives in the registers of its 8 lanes (each computes the same log / exp), a column's in
// thread c's, which also publishes it to shared memory for the row passes.
template <int R, int C, bool IS_KEY, int T, bool kFast>
__device__ __forceinline__ void spread_varn_rtn_pack(const StoreArgs& a, const Exchange& sums,
                                                     const Exchange& vars,
                                                     const SpreadBufs<R, C, T>& b, int m, int blk,
                                                     int head) {
  constexpr int RL = R / kStoreClusterSize, LD = C + 8, CL = C + 16, ER = C / 8, NW = T / 32;
  static_assert(RL * 8 <= T && C <= T && (RL * 8) % 32 == 0, "shape");
  auto rcp = [](float s) { return kFast ? __frcp_rn(s) : 0.0f; };
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, j = tid & 7, l = tid >> 3;
  const bool has_row = tid < RL * 8;
  // this row's (lanes of row l) and this column's (thread c) scales and reciprocals
  float sr = 1.0f, rr = 1.0f, best_sr = 1.0f, best_rr = 1.0f, log_sr = 0.0f;
  float sc = 1.0f, rc = 1.0f, log_sc = 0.0f;
  if (tid < C) b.sc[tid] = b.best_sc[tid] = b.rc[tid] = b.best_rc[tid] = 1.0f;
  __syncthreads();
  float best = 0.0f;
  for (int it = 0; it <= a.iters; ++it) {
    if (tid == 0) {  // the two rounds of this iteration (the last ones have completed)
      sums.expect(4 * kStoreClusterSize * (C + 2 * NW));
      vars.expect(4 * kStoreClusterSize * C);
    }
    // double buffered: a fast CTA sends the next iteration's extremes before this one reads them
    float* row_ext = b.row_ext + (it & 1) * kStoreClusterSize * NW * 2;
    float rmx = -kInf, rmn = kInf;
    if (has_row) {
      float av[ER];
#pragma unroll
      for (int k = 0; k < ER; ++k) av[k] = h2f(b.xh[l * LD + j + 8 * k]);
      if (it > 0) {
        // R1: a = x / s_col; the std of a / s_row (old) sets s_row (R2)
        float v[ER];
#pragma unroll
        for (int k = 0; k < ER; ++k) {
          av[k] = div_scale<kFast>(av[k], b.sc[j + 8 * k], kFast ? b.rc[j + 8 * k] : 0.0f);
          v[k] = div_scale<kFast>(av[k], sr, rr);
        }
        log_sr = next_log_scale(a, log_sr, lanes8_std<C>(v));
        sr = portable_exp(log_sr);
        rr = rcp(sr);
        // R3: cur = a / s_row
#pragma unroll
        for (int k = 0; k < ER; ++k) av[k] = div_scale<kFast>(av[k], sr, rr);
      }
      rmx = rmn = lanes8_std<C>(av);
#pragma unroll
      for (int k = 0; k < ER; ++k) b.cur[l * LD + j + 8 * k] = av[k];
    }
    warp_maxmin<8>(rmx, rmn);
    if (lane < 2) sums.push(row_ext, (m * NW + warp) * 2 + lane, lane ? rmn : rmx);
    __syncthreads();
    const float cs = spread_col_std(sums, vars, it, b, m);  // C1, two exchange rounds
    float cmx = tid < C ? cs : -kInf, cmn = tid < C ? cs : kInf;
    warp_maxmin(cmx, cmn);
    if (lane == 0) {
      b.col_ext[warp * 2] = cmx;
      b.col_ext[warp * 2 + 1] = cmn;
    }
    float sc_next = 0.0f;
    if (tid < C) {  // next s_col (every CTA computes every column's); nothing reads sc until R1
      log_sc = next_log_scale(a, log_sc, cs);
      sc_next = portable_exp(log_sc);
      b.sc[tid] = sc_next;
      if constexpr (kFast) b.rc[tid] = __frcp_rn(sc_next);
    }
    __syncthreads();
    // C2: imbalance; the best scales are this iteration's
    float rx = -kInf, rn = kInf;
    for (int i = lane; i < kStoreClusterSize * NW; i += 32) {
      rx = fmaxf(rx, row_ext[2 * i]);
      rn = fminf(rn, row_ext[2 * i + 1]);
    }
    float cx = lane < NW ? b.col_ext[lane * 2] : -kInf;
    float cn = lane < NW ? b.col_ext[lane * 2 + 1] : kInf;
    const bool better = improves(warp_imbalance(a, cx, cn, rx, rn), best, it);
    if (better) {
      best_sr = sr;
      best_rr = rr;
      if (tid < C) {
        b.best_sc[tid] = sc;
        if constexpr (kFast) b.best_rc[tid] = rc;
      }
    }
    sc = sc_next;
    rc = rcp(sc_next);
  }
  __syncthreads();  // best_sc

  // ---- RTN of this CTA's rows (record rows m + 8 l), pack, scale absorption ----
  const int bits = IS_KEY ? a.key_bits : a.value_bits;
  const float qmax = static_cast<float>((1 << bits) - 1);
  std::uint8_t* rec = tile_record(a, blk, head);
  if (m == 0 && tid < C) {
    const int sb = a.fp8_scales ? 1 : 2;
    store_scale(rec + (IS_KEY ? a.s_row_k : a.s_col_v) + tid * sb, b.best_sc[tid], a.fp8_scales);
  }
  std::uint8_t* codes = reinterpret_cast<std::uint8_t*>(b.cur);  // [RL][CL]
  if (has_row) {
    float mn;
    const float s = rtn_row<ER, kFast>(b.xh + l * LD + j, j, b.best_sc, b.best_rc, best_sr, best_rr,
                                       qmax, codes + l * CL, mn);
    if (j == 0)
      store_row_fields<IS_KEY>(a, rec, m + kStoreClusterSize * l, best_sr * s, best_sr * mn);
  }
  __syncthreads();
  pack_codes<T>(codes, CL, RL, C / (8 / bits), bits, rec + (IS_KEY ? a.k_codes : a.v_codes), m,
                kStoreClusterSize);
  if (!IS_KEY) {
    for (long long i = a.end + m * T + tid; i < a.record_bytes; i += kStoreClusterSize * T)
      rec[i] = 0;
  }
}

template <int D, int G, int R, int C, bool IS_KEY, int T>
__device__ __forceinline__ void spread_stream(const StoreArgs& a, float* smem) {
  constexpr int LD = C + 8;
  cg::cluster_group cluster = cg::this_cluster();
  const SpreadBufs<R, C, T> b(smem);
  __shared__ unsigned warp_mag[3 * (T / 32)];
  __shared__ std::uint64_t bars[2];  // the column-sum and column-variance exchanges
  if (threadIdx.x == 0) {  // before this thread's cluster arrival: remote pushes find them
    mbar_init(&bars[0], 1);
    mbar_init(&bars[1], 1);
  }
  // Every CTA of the cluster must run before the first remote store (spread_rotate waits).
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
  const int m = static_cast<int>(cluster.block_rank());
  const int tile = blockIdx.x / kStoreClusterSize;
  const int blk = tile / a.num_heads, head = tile % a.num_heads;
  const std::uint16_t* in = (IS_KEY ? a.k : a.v) + blk * a.block_stride + head * a.head_stride;
  const Magnitudes mg = a.hadamard == 2
                            ? spread_rotate<D, G, IS_KEY, T, LD, long long>(a, cluster, in, m, b.xh)
                            : spread_rotate<D, G, IS_KEY, T, LD, float>(a, cluster, in, m, b.xh);
  const Exchange sums{&bars[0]}, vars{&bars[1]};
  if (spread_divides_fast<T>(a, cluster, mg, b.mag, warp_mag, m)) {
    spread_varn_rtn_pack<R, C, IS_KEY, T, true>(a, sums, vars, b, m, blk, head);
  } else {
    spread_varn_rtn_pack<R, C, IS_KEY, T, false>(a, sums, vars, b, m, blk, head);
  }
}

}  // namespace detail

template <int D, int G>
constexpr int spread_smem_bytes() {
  constexpr int T = spread_threads<D, G>();
  constexpr int k = detail::SpreadLayout<D, G, T>::kFloats,
                v = detail::SpreadLayout<G, D, T>::kFloats;
  return 4 * (k > v ? k : v);
}

template <int D, int G>
__global__ void __cluster_dims__(kStoreClusterSize, 1, 1) __launch_bounds__(spread_threads<D, G>())
    kvarn_store_spread_kernel(StoreArgs a) {
  extern __shared__ float smem_spread[];
  constexpr int T = spread_threads<D, G>();
  if (blockIdx.y == 0) {
    detail::spread_stream<D, G, D, G, true, T>(a, smem_spread);
  } else {
    detail::spread_stream<D, G, G, D, false, T>(a, smem_spread);
  }
}

}  // namespace kvarn::cuda

#endif  // KVARN_CUDA_STORE_SPREAD_CUH_
