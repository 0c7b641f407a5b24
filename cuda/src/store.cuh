// KVarN store kernel (rotate -> VarN -> RTN -> pack) and the fp16 append kernel.
//
// Store: grid (num_tiles, 2), blockIdx.y = stream (0 keys, 1 values), store_threads<D, G>()
//   threads (512 or 1024).
//   Input rows are fp16, token-major: tile t = (blk, head) with blk = t / num_heads,
//   head = t % num_heads; element (token g, channel d) at
//     in[blk * block_stride + head * head_stride + g * row_stride + d].
//   Output: the record of tile t at records + (dst_block[blk] * num_heads + head) * record_bytes
//   (dst_block == nullptr: identity), byte-identical to kvarn::kvarn_encode_record.
//   Oriented tile R x C (K: R = D channels, C = G tokens; V: R = G tokens, C = D channels).
//   Shared memory: cur fp32 [R][C + 8] (FWHT scratch, then the current balanced tile, then the
//   codes), x fp16 [R][C + 8] (the rotated fp16 tile: exact, read every iteration), per-axis
//   scale/std vectors and per-warp max/min partials.
//   Parallel but bit-identical (latency): every row/column statistic is split over 8 adjacent
//   lanes; lane j accumulates the elements i = j (mod 8) in increasing i (the canonical partial
//   p[j] of reduce.hpp) and three xor shuffles (4, 2, 1) form exactly combine8's tree
//   ((p0+p4)+(p2+p6)) + ((p1+p5)+(p3+p7)) in every lane. Row items (r, j) own row r's elements
//   c = j + 8k in registers; column items (c, j) read rows r = j + 8k of cur. The scale updates
//   (portable log/exp in double) run once per row/column, thread r or c. Divisions keep the
//   reference order (x / s_col) / s_row, max/min are order independent (RTN's min/max keep the
//   first index among equal values, as the sequential std::min/std::max scan), RNE rounding,
//   compiled with --fmad=false. Five barriers per VarN iteration.
//   Divisions by a scale: where the tile allows (varn_division_bounds: no -0, Inf or NaN, nonzero
//   magnitudes in [div_lo, div_hi]; checked once per tile), by the scale's correctly rounded
//   reciprocal and two fused corrections (Markstein; the CPU's FMA build does the same), which
//   gives the bits of the IEEE division in 5 instructions instead of ~11 with a slow-path branch;
//   elsewhere by the IEEE division. The whole VarN + RTN part is compiled both ways.
//
// Rotation (hadamard = 2, the default): the published fp16 matrix computed exactly as on the CPU
//   (hadamard_fp16.hpp): int64 butterflies over half the tile's tokens at a time (D * G/2 int64
//   fit in the fp32 buffer), then one correct rounding per element straight into x. A value
//   beyond the fp16 range (which the CPU reference rejects) sets *overflow.
//
// Append: grid (num_tokens), rows [num_tokens, num_heads, D] fp16 -> rotated fp16 rows into
//   pool[(slot * num_heads + head) * G + offset][D], slot/offset = pool_pos[token] / % G.
#ifndef KVARN_CUDA_STORE_CUH_
#define KVARN_CUDA_STORE_CUH_

#include <cuda_fp16.h>

#include <cstdint>

#include "common.cuh"
#include "kvarn/core/hadamard_fp16.hpp"
#include "kvarn/core/pack.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/reduce.hpp"

namespace kvarn::cuda {

struct StoreArgs {
  const std::uint16_t* k;
  const std::uint16_t* v;
  long long block_stride, head_stride, row_stride;
  int num_heads;
  const int* dst_block;
  std::uint8_t* records;
  long long record_bytes;
  int key_bits, value_bits;
  int fp8_scales;
  int hadamard;     // 0 none, 1 exact-scale fp32 FWHT (rot_scale), 2 published fp16 matrix (rot_c)
  float rot_scale;  // 1/sqrt(D)
  Fp16Scale rot_c;  // fp16(1/sqrt(D)) as m * 2^e
  int* overflow;    // optional: set to 1 when a rotated value is beyond the fp16 range
  int iters;
  float std_min, std_max, log_min, log_max, floor;
  double div_lo, div_hi;  // varn_division_bounds: the tile magnitudes of the divider-free path
  int rows_16b;  // k, v and every stride allow 16-byte loads of 8 channels (rotate_fp16_exact)
  // record layout (byte offsets)
  int k_codes, s_col_k, zp_k, s_row_k, v_codes, s_col_v, s_row_v, zp_v, end;
};

namespace detail {

__device__ __forceinline__ float clampf_ref(float x, float lo, float hi) {
  // std::min(std::max(x, lo), hi) for non-NaN x
  float y = x < lo ? lo : x;
  return hi < y ? hi : y;
}

// a / b correctly rounded. kFast: y = RN(1/b) and Markstein's corrections (exact under
// varn_division_bounds: every dividend +0 or within [2^-60, 2^60], b positive within it).
template <bool kFast>
__device__ __forceinline__ float div_scale(float a, float b, float y) {
  if constexpr (kFast) {
    const float q0 = __fmul_rn(a, y);
    const float q1 = __fmaf_rn(__fmaf_rn(-b, q0, a), y, q0);
    return __fmaf_rn(__fmaf_rn(-b, q1, a), y, q1);
  } else {
    return a / b;
  }
}

// combine8 over the 8 lanes of an aligned lane group, lane j holding p[j]: xor 4 pairs
// (p0+p4), (p1+p5), (p2+p6), (p3+p7); xor 2 gives (p0+p4)+(p2+p6) and (p1+p5)+(p3+p7); xor 1
// adds those two. a + b == b + a bitwise, so every lane ends with combine8's exact value.
__device__ __forceinline__ float combine8_lanes(float p) {
  p = p + __shfl_xor_sync(0xffffffffu, p, 4);
  p = p + __shfl_xor_sync(0xffffffffu, p, 2);
  p = p + __shfl_xor_sync(0xffffffffu, p, 1);
  return p;
}

// Max and min over the warp; kFrom > 1 where aligned groups of kFrom lanes hold equal values.
template <int kFrom = 1>
__device__ __forceinline__ void warp_maxmin(float& mx, float& mn) {
#pragma unroll
  for (int o = 16; o >= kFrom; o >>= 1) {
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
  }
}

__device__ __forceinline__ void store_scale(std::uint8_t* dst, float v, int fp8) {
  if (fp8) {
    dst[0] = float_to_fp8_bits(v, Fp8Format::kE4M3);
  } else {
    const std::uint16_t h = float_to_half_bits(v);
    dst[0] = static_cast<std::uint8_t>(h & 0xff);
    dst[1] = static_cast<std::uint8_t>(h >> 8);
  }
}
__device__ __forceinline__ void store_half(std::uint8_t* dst, float v) {
  const std::uint16_t h = float_to_half_bits(v);
  dst[0] = static_cast<std::uint8_t>(h & 0xff);
  dst[1] = static_cast<std::uint8_t>(h >> 8);
}

// float_to_half_bits by the hardware conversion: the same bits for every non-NaN input
// (checked over all 2^32), NaN through the portable path (its payload rule).
__device__ __forceinline__ std::uint16_t half_bits_rn(float f) {
  return isnan(f) ? float_to_half_bits(f) : __half_as_ushort(__float2half_rn(f));
}

// float_to_half_bits(hadamard_fp16_scale(s24, c)) by hardware conversions: the product rounded
// to odd at 24 bits (truncation, then the sticky bit where it was inexact; |s24 c.m| < 2^63),
// scaled by 2^(c.e - 24) exactly (the result is a normal float), then one rounding to fp16.
__device__ __forceinline__ std::uint16_t hadamard_fp16_bits(long long s24, Fp16Scale c) {
  const long long p = s24 * c.m;
  float f = __ll2float_rz(p);
  if (__float2ll_rz(f) != p) f = __uint_as_float(__float_as_uint(f) | 1u);
  return __half_as_ushort(__float2half_rn(f * __uint_as_float((c.e - 24 + 127) << 23)));
}

constexpr float kInf = __builtin_huge_valf();

// fp16 bits -> float by the hardware conversion (exact for every fp16 value, subnormals too).
__device__ __forceinline__ float h2f(std::uint16_t h) { return __half2float(__ushort_as_half(h)); }

// Eight-point FWHT in registers: v[k] for the channels d0 + k s (the stages h = s, 2s, 4s of the
// full transform; integer adds are exact, so any stage order gives the same sums).
// Acc long long (exact) or float (the fp32 FWHT, rounded as the CPU's stage order).
template <typename Acc>
__device__ __forceinline__ void fwht8(Acc (&v)[8]) {
#pragma unroll
  for (int h = 1; h < 8; h <<= 1)
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if ((k & h) == 0) {
        const Acc x0 = v[k], x1 = v[k + h];
        v[k] = x0 + x1;
        v[k + h] = x0 - x1;
      }
}

// The 8 fp16 channels at src: one 16-byte load where the host checked the alignment of every
// row group (rows_16b), else element loads.
__device__ __forceinline__ void load8_halves(const StoreArgs& a, const std::uint16_t* src,
                                             std::uint16_t (&xs)[8]) {
  if (a.rows_16b) {
    const uint4 raw = *reinterpret_cast<const uint4*>(src);
    const std::uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 8; ++k) xs[k] = static_cast<std::uint16_t>(w[k / 2] >> (16 * (k % 2)));
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) xs[k] = src[k];
  }
}

// The magnitudes of the rotated tile that decide the divider-free path: min nonzero |x| bits,
// max |x| bits, whether a -0, Inf or NaN was seen.
struct Magnitudes {
  unsigned lo = 0xffffu, hi = 0, bad = 0;
  __device__ void add(std::uint16_t h) {
    const unsigned mg = h & 0x7fffu;
    bad |= (h == 0x8000u || mg >= 0x7c00u) ? 1u : 0u;
    hi = max(hi, mg);
    lo = min(lo, mg == 0 ? 0xffffu : mg);
  }
  __device__ void add(const Magnitudes& o) {
    lo = min(lo, o.lo);
    hi = max(hi, o.hi);
    bad |= o.bad;
  }
  // over the warp, every lane ends with the warp's magnitudes
  __device__ void warp_reduce() {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      Magnitudes other;
      other.lo = __shfl_xor_sync(0xffffffffu, lo, o);
      other.hi = __shfl_xor_sync(0xffffffffu, hi, o);
      other.bad = __shfl_xor_sync(0xffffffffu, bad, o);
      add(other);
    }
  }
  // varn_division_bounds: no -0, Inf or NaN, nonzero magnitudes within [div_lo, div_hi]
  __device__ bool divides_fast(const StoreArgs& a) const {
    if (bad != 0) return false;
    if (hi == 0) return true;
    return static_cast<double>(h2f(static_cast<std::uint16_t>(lo))) >= a.div_lo &&
           static_cast<double>(h2f(static_cast<std::uint16_t>(hi))) <= a.div_hi;
  }
};

// The published fp16 rotation of one oriented tile into x (fp16 bits, pitch LD), exactly as
// Rotation(kHadamardFp16), half the tile's tokens at a time: acc holds D x G/2 int64 (token-half
// h: acc[d * G/2 + g - h * G/2]). The FWHT along d in three passes of register butterflies: the
// load does stages 1-4 (8 consecutive channels of a token, one 16-byte load), the second pass
// stages 8-32 (channels d0 + 8k), the rounding pass stage 64 (D 128). Lanes take consecutive
// tokens, so the int64 accesses are conflict-free.
template <int D, int G, bool IS_KEY, int T, int LD>
__device__ __forceinline__ void rotate_fp16_exact(const StoreArgs& a, const std::uint16_t* in,
                                                  long long* acc, std::uint16_t* xh) {
  static_assert(D == 64 || D == 128, "stages 1-32 in two passes, 64 in the rounding pass");
  constexpr int GH = G / 2, kGroups = D / 8;
  const int tid = threadIdx.x;
  for (int half = 0; half < 2; ++half) {
    for (int it = tid; it < GH * kGroups; it += T) {  // stages 1, 2, 4
      const int gl = it % GH, d0 = 8 * (it / GH);
      const std::uint16_t* src = in + (half * GH + gl) * a.row_stride + d0;
      std::uint16_t xs[8];
      load8_halves(a, src, xs);
      long long v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const std::uint16_t x = xs[k];
        if ((x & 0x7c00u) == 0x7c00u && a.overflow) atomicExch(a.overflow, 1);
        v[k] = half_to_fixed24(x);
      }
      fwht8(v);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[(d0 + k) * GH + gl] = v[k];
    }
    __syncthreads();
    for (int it = tid; it < GH * kGroups; it += T) {  // stages 8, 16, 32
      const int gl = it % GH, grp = it / GH, d0 = grp % 8 + 64 * (grp / 8);
      long long v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = acc[(d0 + 8 * k) * GH + gl];
      fwht8(v);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[(d0 + 8 * k) * GH + gl] = v[k];
    }
    __syncthreads();
    auto put = [&](int d, int gl, long long s24) {
      const int g = half * GH + gl;
      const std::uint16_t hb = hadamard_fp16_bits(s24, a.rot_c);
      if ((hb & 0x7c00u) == 0x7c00u && a.overflow) atomicExch(a.overflow, 1);
      xh[IS_KEY ? d * LD + g : g * LD + d] = hb;
    };
    for (int it = tid; it < GH * 64; it += T) {  // stage 64 (D 128), rounding
      const int gl = it % GH, d = it / GH;
      const long long x0 = acc[d * GH + gl];
      if constexpr (D == 128) {
        const long long x1 = acc[(d + 64) * GH + gl];
        put(d, gl, x0 + x1);
        put(d + 64, gl, x0 - x1);
      } else {
        put(d, gl, x0);
      }
    }
    __syncthreads();
  }
}

// Shared memory of one stream: cur fp32 [R][C + 8] (F floats), x fp16 [R][C + 8], then vectors
// of M = max(D, G) floats and the per-warp max/min partials.
template <int F, int M>
struct StoreBufs {
  float* cur;
  std::uint16_t* xh;
  float* sc;  // s_col of the current iteration
  float* best_sc;
  float* tmp_c;  // column stds
  float* sr;     // s_row of the current iteration
  float* best_sr;
  float* tmp_r;  // row stds for the s_row update
  float* rc;     // RN(1 / s) of sc, best_sc, sr, best_sr (the divider-free path)
  float* best_rc;
  float* rr;
  float* best_rr;
  float* part;  // [parity][row/col][warp][max, min]
  __device__ explicit StoreBufs(float* smem)
      : cur(smem),
        xh(reinterpret_cast<std::uint16_t*>(smem + F)),
        sc(smem + F + F / 2),
        best_sc(sc + M),
        tmp_c(best_sc + M),
        sr(tmp_c + M),
        best_sr(sr + M),
        tmp_r(best_sr + M),
        rc(tmp_r + M),
        best_rc(rc + M),
        rr(best_rc + M),
        best_rr(rr + M),
        part(best_rr + M) {}
};
constexpr int kStoreVectors = 10;  // M-float vectors of StoreBufs

// One VarN scale update in the log domain: the running log scale plus log(clamped std), clamped.
__device__ __forceinline__ float next_log_scale(const StoreArgs& a, float log_t, float stdv) {
  return clampf_ref(log_t + portable_log(clampf_ref(stdv, a.std_min, a.std_max)), a.log_min,
                    a.log_max);
}

// VarN's imbalance from the column and row std extremes, each lane holding partial extremes.
__device__ __forceinline__ float warp_imbalance(const StoreArgs& a, float cx, float cn, float rx,
                                                float rn) {
  warp_maxmin(rx, rn);
  warp_maxmin(cx, cn);
  return cx / fmaxf(cn, a.floor) + rx / fmaxf(rn, a.floor);
}

// Whether iteration it's imbalance is the best so far (ties go to the later iteration); the
// first iteration only sets the reference.
__device__ __forceinline__ bool improves(float imb, float& best, int it) {
  if (it == 0) {
    best = imb;
    return false;
  }
  if (!(imb <= best)) return false;  // NaN is never better
  best = imb;
  return true;
}

// Unbiased std (reduce.hpp's order) of an N-element row held by 8 adjacent lanes, lane j holding
// the elements j + 8k in x[k].
template <int N, int ER>
__device__ __forceinline__ float lanes8_std(const float (&x)[ER]) {
  float p = 0.0f;
#pragma unroll
  for (int k = 0; k < ER; ++k) p += x[k];
  const float mean = combine8_lanes(p) / static_cast<float>(N);
  p = 0.0f;
#pragma unroll
  for (int k = 0; k < ER; ++k) {
    const float dv = x[k] - mean;
    p += dv * dv;
  }
  return sqrt_rn(combine8_lanes(p) / static_cast<float>(N - 1));
}

// RTN of one oriented row held by 8 lanes (lane j: the elements c = j + 8k of x / best_sc / bs,
// xr = the row's fp16 elements + j): codes into code_row[j + 8k]. Returns the step; mn_out the
// row minimum. min/max as the sequential std::min/std::max scan (first index among equals).
template <int ER, bool kFast>
__device__ __forceinline__ float rtn_row(const std::uint16_t* xr, int j, const float* best_sc,
                                         const float* best_rc, float bs, float ybs, float qmax,
                                         std::uint8_t* code_row, float& mn_out) {
  float bv[ER];
#pragma unroll
  for (int k = 0; k < ER; ++k)
    bv[k] = div_scale<kFast>(
        div_scale<kFast>(h2f(xr[8 * k]), best_sc[j + 8 * k], kFast ? best_rc[j + 8 * k] : 0.0f), bs,
        ybs);
  float mn = bv[0], mx = bv[0];
  int imn = j, imx = j;
#pragma unroll
  for (int k = 1; k < ER; ++k) {
    if (bv[k] < mn) {
      mn = bv[k];
      imn = j + 8 * k;
    }
    if (bv[k] > mx) {
      mx = bv[k];
      imx = j + 8 * k;
    }
  }
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) {
    const float omn = __shfl_xor_sync(0xffffffffu, mn, o);
    const int oimn = __shfl_xor_sync(0xffffffffu, imn, o);
    const float omx = __shfl_xor_sync(0xffffffffu, mx, o);
    const int oimx = __shfl_xor_sync(0xffffffffu, imx, o);
    if (omn < mn || (omn == mn && oimn < imn)) {
      mn = omn;
      imn = oimn;
    }
    if (omx > mx || (omx == mx && oimx < imx)) {
      mx = omx;
      imx = oimx;
    }
  }
  const float s = fmaxf((mx - mn) / qmax, 1e-10f);
#pragma unroll
  for (int k = 0; k < ER; ++k) {
    float q = round_half_even((bv[k] - mn) / s);
    q = fminf(fmaxf(q, 0.0f), qmax);
    code_row[j + 8 * k] = static_cast<std::uint8_t>(static_cast<unsigned>(q));
  }
  mn_out = mn;
  return s;
}

// The per-row fields of oriented row r: K rows are channels (s_col_k, zp_k), V rows tokens
// (s_row_v, zp_v).
template <bool IS_KEY>
__device__ __forceinline__ void store_row_fields(const StoreArgs& a, std::uint8_t* rec, int r,
                                                 float scale, float zero) {
  const int sb = a.fp8_scales ? 1 : 2;
  store_scale(rec + (IS_KEY ? a.s_col_k : a.s_row_v) + r * sb, scale, a.fp8_scales);
  store_half(rec + (IS_KEY ? a.zp_k : a.zp_v) + r * 2, zero);
}

// Packs `rows` code rows (one byte per code, pitch cl) into dst, `bits` per code, buffer row l
// to record row row0 + step * l; four bytes per store where dst and the rows allow.
template <int T>
__device__ __forceinline__ void pack_codes(const std::uint8_t* codes, int cl, int rows,
                                           int row_bytes, int bits, std::uint8_t* dst, int row0,
                                           int step) {
  const int pf = 8 / bits;
  const bool words = reinterpret_cast<std::uintptr_t>(dst) % 4 == 0 && row_bytes % 4 == 0;
  const int unit = words ? 4 : 1, per_row = row_bytes / unit;
  for (int w = threadIdx.x; w < rows * per_row; w += T) {
    const int l = w / per_row, wb = (w % per_row) * unit;
    const std::uint8_t* src = codes + l * cl + wb * pf;
    unsigned word = 0;
    for (int b = 0; b < unit; ++b) {
      unsigned acc = 0;
      for (int k = 0; k < pf; ++k) acc |= static_cast<unsigned>(src[b * pf + k]) << (k * bits);
      word |= acc << (8 * b);
    }
    std::uint8_t* out = dst + static_cast<long long>(row0 + step * l) * row_bytes + wb;
    if (words) {
      *reinterpret_cast<unsigned*>(out) = word;
    } else {
      *out = static_cast<std::uint8_t>(word);
    }
  }
}

// The record of tile (blk, head).
__device__ __forceinline__ std::uint8_t* tile_record(const StoreArgs& a, int blk, int head) {
  return a.records +
         ((a.dst_block ? static_cast<long long>(a.dst_block[blk]) : blk) * a.num_heads + head) *
             a.record_bytes;
}

// Whether every division of this tile's VarN may take the divider-free path: no -0, Inf or NaN
// in the rotated fp16 tile x and its nonzero magnitudes within [div_lo, div_hi] (all +0 is fine).
// mag (shared): {min nonzero |x| bits, max |x| bits, -0/Inf/NaN seen}, preset {0xffff, 0, 0}.
template <int R, int C, int T, int LD>
__device__ __forceinline__ bool tile_divides_fast(const StoreArgs& a, const std::uint16_t* xh,
                                                  unsigned* mag) {
  Magnitudes mg;
  for (int i = threadIdx.x; i < R * C; i += T) mg.add(xh[(i / C) * LD + i % C]);
  mg.warp_reduce();
  if ((threadIdx.x & 31) == 0) {
    atomicMin(&mag[0], mg.lo);
    atomicMax(&mag[1], mg.hi);
    atomicOr(&mag[2], mg.bad);
  }
  __syncthreads();
  Magnitudes all;
  all.lo = mag[0];
  all.hi = mag[1];
  all.bad = mag[2];
  return all.divides_fast(a);
}

// VarN, RTN per oriented row, packing and scale absorption of one stream's rotated tile (sb.xh),
// each division by a scale through div_scale<kFast>.
template <int D, int G, int R, int C, bool IS_KEY, int T, int F, bool kFast>
__device__ __forceinline__ void varn_rtn_pack(const StoreArgs& a,
                                              const StoreBufs<F, (D > G ? D : G)>& bufs, int blk,
                                              int head) {
  constexpr int LD = C + 8;   // fp32 and fp16 row pitch (conflict-free row access)
  constexpr int CL = C + 16;  // code byte pitch
  constexpr int ER = C / 8;   // elements per row lane
  constexpr int EC = R / 8;   // elements per column lane
  constexpr int NRI = (R * 8 + T - 1) / T, NCI = (C * 8 + T - 1) / T;
  constexpr int NW = T / 32;
  static_assert(
      R <= T && C <= T && NW <= 32 && T % 32 == 0 && (R * 8) % 32 == 0 && (C * 8) % 32 == 0,
      "shape");
  float* cur = bufs.cur;
  const std::uint16_t* xh = bufs.xh;
  float* sc_buf = bufs.sc;
  float* best_sc_buf = bufs.best_sc;
  float* tmp_c = bufs.tmp_c;
  float* sr_buf = bufs.sr;
  float* best_sr_buf = bufs.best_sr;
  float* tmp_r = bufs.tmp_r;
  float* part = bufs.part;
  // reciprocals, read only by the divider-free path
  auto rcp = [](const float* buf, int i) { return kFast ? buf[i] : 0.0f; };
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, j = tid & 7;

  // ---- VarN: iteration 0 = the initial statistics (scales 1) ----
  // Per iteration: [R1 a = x / s_col, stds of a / s_row -> tmp_r] | [R2 new s_row, one thread
  // per row] | [R3 cur = a / s_row, row stds, cur to shared] | [C1 column stds -> tmp_c] |
  // [C2 imbalance, best scales, next s_col, one thread per column] |. R1/R2 are skipped at
  // iteration 0. The log/exp chains (double) run once per row/column, not once per lane.
  float log_sr_t = 0.0f, log_sc_t = 0.0f;  // owned by thread r (< R) / c (< C)
  if (tid < R) {
    sr_buf[tid] = 1.0f;
    best_sr_buf[tid] = 1.0f;
    bufs.rr[tid] = 1.0f;
    bufs.best_rr[tid] = 1.0f;
  }
  if (tid < C) {
    sc_buf[tid] = 1.0f;
    best_sc_buf[tid] = 1.0f;
    bufs.rc[tid] = 1.0f;
    bufs.best_rc[tid] = 1.0f;
  }
  __syncthreads();
  float best = 0.0f;
  for (int it = 0; it <= a.iters; ++it) {
    float* pr = part + (it & 1) * 4 * 32;  // [row/col][warp][2]
    float av[NRI][ER];
#pragma unroll
    for (int ii = 0; ii < NRI; ++ii) {
      const int item = tid + ii * T;
      if (item < R * 8) {
        const std::uint16_t* xr = xh + (item >> 3) * LD + j;
#pragma unroll
        for (int k = 0; k < ER; ++k) av[ii][k] = h2f(xr[8 * k]);
      }
    }
    if (it > 0) {
      // R1
#pragma unroll
      for (int ii = 0; ii < NRI; ++ii) {
        const int item = tid + ii * T;
        if (item < R * 8) {
          const int r = item >> 3;
          float* cr = cur + r * LD + j;  // this lane's slots: scratch for a / s_row
#pragma unroll
          for (int k = 0; k < ER; ++k)
            av[ii][k] = div_scale<kFast>(av[ii][k], sc_buf[j + 8 * k], rcp(bufs.rc, j + 8 * k));
          const float so = sr_buf[r], yo = rcp(bufs.rr, r);
          float p = 0.0f;
#pragma unroll
          for (int k = 0; k < ER; ++k) {
            const float v = div_scale<kFast>(av[ii][k], so, yo);
            cr[8 * k] = v;
            p += v;
          }
          const float mean = combine8_lanes(p) / static_cast<float>(C);
          p = 0.0f;
#pragma unroll
          for (int k = 0; k < ER; ++k) {
            const float dv = cr[8 * k] - mean;
            p += dv * dv;
          }
          const float s = sqrt_rn(combine8_lanes(p) / static_cast<float>(C - 1));
          if (j == 0) tmp_r[r] = s;
        }
      }
      __syncthreads();
      // R2
      if (tid < R) {
        log_sr_t = next_log_scale(a, log_sr_t, tmp_r[tid]);
        const float s = portable_exp(log_sr_t);
        sr_buf[tid] = s;
        if constexpr (kFast) bufs.rr[tid] = __frcp_rn(s);
      }
      __syncthreads();
    }
    // R3
    float rmx = -kInf, rmn = kInf;
#pragma unroll
    for (int ii = 0; ii < NRI; ++ii) {
      const int item = tid + ii * T;
      if (item < R * 8) {
        const int r = item >> 3;
        if (it > 0) {
          const float sn = sr_buf[r], yn = rcp(bufs.rr, r);
#pragma unroll
          for (int k = 0; k < ER; ++k) av[ii][k] = div_scale<kFast>(av[ii][k], sn, yn);
        }
        const float rs = lanes8_std<C>(av[ii]);
        rmx = fmaxf(rmx, rs);
        rmn = fminf(rmn, rs);
        float* cr = cur + r * LD + j;
#pragma unroll
        for (int k = 0; k < ER; ++k) cr[8 * k] = av[ii][k];
      }
    }
    warp_maxmin(rmx, rmn);
    if (lane == 0) {
      pr[warp * 2] = rmx;
      pr[warp * 2 + 1] = rmn;
    }
    __syncthreads();
    // C1
    float cmx = -kInf, cmn = kInf;
#pragma unroll
    for (int ii = 0; ii < NCI; ++ii) {
      const int item = tid + ii * T;
      if (item < C * 8) {
        const int c = item >> 3;
        const float* cc = cur + j * LD + c;
        float p = 0.0f;
#pragma unroll
        for (int k = 0; k < EC; ++k) p += cc[8 * k * LD];
        const float mean = combine8_lanes(p) / static_cast<float>(R);
        p = 0.0f;
#pragma unroll
        for (int k = 0; k < EC; ++k) {
          const float dv = cc[8 * k * LD] - mean;
          p += dv * dv;
        }
        const float cs = sqrt_rn(combine8_lanes(p) / static_cast<float>(R - 1));
        cmx = fmaxf(cmx, cs);
        cmn = fminf(cmn, cs);
        if (j == 0) tmp_c[c] = cs;
      }
    }
    warp_maxmin(cmx, cmn);
    if (lane == 0) {
      pr[64 + warp * 2] = cmx;
      pr[64 + warp * 2 + 1] = cmn;
    }
    __syncthreads();
    // C2: imbalance ratio(col) + ratio(row), every warp alike; best scales; next s_col.
    float rx = lane < NW ? pr[lane * 2] : -kInf, rn = lane < NW ? pr[lane * 2 + 1] : kInf;
    float cx = lane < NW ? pr[64 + lane * 2] : -kInf, cn = lane < NW ? pr[64 + lane * 2 + 1] : kInf;
    const bool better = improves(warp_imbalance(a, cx, cn, rx, rn), best, it);
    if (tid < R && better) {
      best_sr_buf[tid] = sr_buf[tid];
      if constexpr (kFast) bufs.best_rr[tid] = bufs.rr[tid];
    }
    if (tid < C) {
      if (better) {
        best_sc_buf[tid] = sc_buf[tid];
        if constexpr (kFast) bufs.best_rc[tid] = bufs.rc[tid];
      }
      log_sc_t = next_log_scale(a, log_sc_t, tmp_c[tid]);
      const float s = portable_exp(log_sc_t);  // s_col of the next iteration
      sc_buf[tid] = s;
      if constexpr (kFast) bufs.rc[tid] = __frcp_rn(s);
    }
    __syncthreads();
  }

  // ---- RTN per oriented row, pack, scale absorption ----
  const int bits = IS_KEY ? a.key_bits : a.value_bits;
  const float qmax = static_cast<float>((1 << bits) - 1);
  std::uint8_t* rec = tile_record(a, blk, head);
  const int sb = a.fp8_scales ? 1 : 2;
  if (tid < C)
    store_scale(rec + (IS_KEY ? a.s_row_k : a.s_col_v) + tid * sb, best_sc_buf[tid], a.fp8_scales);
  std::uint8_t* codes = reinterpret_cast<std::uint8_t*>(cur);  // [R][CL]
#pragma unroll
  for (int ii = 0; ii < NRI; ++ii) {
    const int item = tid + ii * T;
    if (item < R * 8) {
      const int r = item >> 3;
      const float bs = best_sr_buf[r];
      float mn;
      const float s = rtn_row<ER, kFast>(xh + r * LD + j, j, best_sc_buf, bufs.best_rc, bs,
                                         rcp(bufs.best_rr, r), qmax, codes + r * CL, mn);
      if (j == 0) store_row_fields<IS_KEY>(a, rec, r, bs * s, bs * mn);
    }
  }
  __syncthreads();
  pack_codes<T>(codes, CL, R, C / (8 / bits), bits, rec + (IS_KEY ? a.k_codes : a.v_codes), 0, 1);
  if (!IS_KEY) {
    for (long long i = a.end + tid; i < a.record_bytes; i += T) rec[i] = 0;
  }
}

// One stream of one tile: oriented R x C, T threads, F floats per [R][C + 8] buffer. Rotates,
// then runs VarN, RTN and the packing with or without the divider (tile_divides_fast).
template <int D, int G, int R, int C, bool IS_KEY, int T, int F>
__device__ __forceinline__ void store_stream(const StoreArgs& a, float* smem) {
  constexpr int LD = C + 8;  // fp32 and fp16 row pitch (conflict-free row access)
  constexpr int M = D > G ? D : G;
  const StoreBufs<F, M> sb(smem);
  float* cur = sb.cur;
  std::uint16_t* xh = sb.xh;
  __shared__ unsigned tile_mag[3];  // tile_divides_fast
  const int tid = threadIdx.x;
  if (tid == 0) {
    tile_mag[0] = 0xffffu;
    tile_mag[1] = 0;
    tile_mag[2] = 0;
  }

  const int tile = blockIdx.x;
  const int blk = tile / a.num_heads, head = tile % a.num_heads;
  const std::uint16_t* in = (IS_KEY ? a.k : a.v) + blk * a.block_stride + head * a.head_stride;

  // ---- load, rotate (FWHT along d), round to fp16 ----
  if (a.hadamard == 2) {
    rotate_fp16_exact<D, G, IS_KEY, T, LD>(a, in, reinterpret_cast<long long*>(cur), xh);
  } else {
    for (int i = tid; i < G * D; i += T) {
      const int g = i / D, d = i % D;
      const float v = half_bits_to_float(in[g * a.row_stride + d]);
      if (IS_KEY) {
        cur[d * LD + g] = v;
      } else {
        cur[g * LD + d] = v;
      }
    }
    __syncthreads();
    if (a.hadamard) {
      for (int h = 1; h < D; h <<= 1) {
        for (int p = tid; p < G * D / 2; p += T) {
          int g, q;
          if (IS_KEY) {
            g = p % G;
            q = p / G;
          } else {
            q = p % (D / 2);
            g = p / (D / 2);
          }
          const int jj = (q / h) * 2 * h + q % h;
          float* u = IS_KEY ? cur + jj * LD + g : cur + g * LD + jj;
          const int step = IS_KEY ? h * LD : h;
          const float x0 = u[0], x1 = u[step];
          u[0] = x0 + x1;
          u[step] = x0 - x1;
        }
        __syncthreads();
      }
    }
    for (int i = tid; i < R * C; i += T) {
      const int r = i / C, c = i % C;
      const float v = cur[r * LD + c];
      const std::uint16_t hb = half_bits_rn(a.hadamard ? v * a.rot_scale : v);
      if ((hb & 0x7c00u) == 0x7c00u && a.overflow) atomicExch(a.overflow, 1);
      xh[r * LD + c] = hb;
    }
    __syncthreads();
  }
  if (tile_divides_fast<R, C, T, LD>(a, xh, tile_mag)) {
    varn_rtn_pack<D, G, R, C, IS_KEY, T, F, true>(a, sb, blk, head);
  } else {
    varn_rtn_pack<D, G, R, C, IS_KEY, T, F, false>(a, sb, blk, head);
  }
}

}  // namespace detail

template <int D, int G>
constexpr int store_threads() {
  return (D > G ? D : G) * 8 >= 1024 ? 1024 : 512;
}

// floats of one [R][C + 8] buffer, the larger of both orientations (even)
template <int D, int G>
constexpr int store_tile_floats() {
  return D * (G + 8) > G * (D + 8) ? D * (G + 8) : G * (D + 8);
}

template <int D, int G>
constexpr int store_smem_bytes() {
  constexpr int F = store_tile_floats<D, G>();
  return 4 * (F + F / 2 + detail::kStoreVectors * (D > G ? D : G) + 2 * 4 * 32);
}

template <int D, int G>
__global__ void __launch_bounds__(store_threads<D, G>(), 1) kvarn_store_kernel(StoreArgs a) {
  extern __shared__ float smem[];
  constexpr int T = store_threads<D, G>();
  constexpr int F = store_tile_floats<D, G>();
  if (blockIdx.y == 0) {
    detail::store_stream<D, G, D, G, true, T, F>(a, smem);
  } else {
    detail::store_stream<D, G, G, D, false, T, F>(a, smem);
  }
}

// ---- append: rotate + fp16 round new rows into the pool ----
struct AppendArgs {
  const std::uint16_t* k;  // [n, H, D]
  const std::uint16_t* v;
  const long long* pool_pos;  // [n]: slot * G + offset
  std::uint16_t* k_pool;      // [slots, H, G, D]
  std::uint16_t* v_pool;
  int num_heads, group, hadamard;  // hadamard as StoreArgs
  float rot_scale;
  Fp16Scale rot_c;
};

// Acc: float (no rotation / exact-scale FWHT) or long long (the published fp16 matrix, exact).
template <int D, typename Acc>
__global__ void __launch_bounds__(128) kvarn_append_kernel(AppendArgs a) {
  extern __shared__ float smem_append[];
  Acc* buf = reinterpret_cast<Acc*>(smem_append);  // [2][H][D]
  constexpr bool kExact = sizeof(Acc) == 8;
  const int tok = blockIdx.x, H = a.num_heads, n = 2 * H * D;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int s = i / (H * D), rest = i % (H * D);
    const std::uint16_t* src = (s == 0 ? a.k : a.v) + static_cast<long long>(tok) * H * D;
    if constexpr (kExact) {
      buf[i] = half_to_fixed24(src[rest]);
    } else {
      buf[i] = half_bits_to_float(src[rest]);
    }
  }
  __syncthreads();
  if (a.hadamard) {
    for (int h = 1; h < D; h <<= 1) {
      for (int p = threadIdx.x; p < n / 2; p += blockDim.x) {
        const int row = p / (D / 2), q = p % (D / 2);
        const int j = row * D + (q / h) * 2 * h + q % h;
        const Acc u = buf[j], w = buf[j + h];
        buf[j] = u + w;
        buf[j + h] = u - w;
      }
      __syncthreads();
    }
  }
  const long long pos = a.pool_pos[tok];
  const long long slot = pos / a.group, off = pos % a.group;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int s = i / (H * D), rest = i % (H * D), head = rest / D, d = rest % D;
    std::uint16_t hb;
    if constexpr (kExact) {
      hb = float_to_half_bits(hadamard_fp16_scale(buf[i], a.rot_c));
    } else {
      hb = float_to_half_bits(a.hadamard ? buf[i] * a.rot_scale : buf[i]);
    }
    std::uint16_t* dst = s == 0 ? a.k_pool : a.v_pool;
    dst[((slot * H + head) * a.group + off) * D + d] = hb;
  }
}

}  // namespace kvarn::cuda

#endif  // KVARN_CUDA_STORE_CUH_
