// KVarN store kernel (rotate -> VarN -> RTN -> pack) and the fp16 append kernel.
//
// Store: grid (num_tiles, 2), blockIdx.y = stream (0 keys, 1 values), kStoreThreads threads.
//   Input rows are fp16, token-major: tile t = (blk, head) with blk = t / num_heads,
//   head = t % num_heads; element (token g, channel d) at
//     in[blk * block_stride + head * head_stride + g * row_stride + d].
//   Output: the record of tile t at records + (dst_block[blk] * num_heads + head) * record_bytes
//   (dst_block == nullptr: identity), byte-identical to kvarn::kvarn_encode_record.
//   Shared memory: the oriented fp32 tile X[R][C + 1] (K: R = D channels, C = G tokens;
//   V: R = G tokens, C = D channels; +1 pads rows across banks), then per-axis vectors.
//   Bit-identity: every statistic runs in one thread in the canonical order of reduce.hpp
//   (thread r owns row r, thread c owns column c), divisions in the reference order
//   (x / s_col) / s_row, portable log/exp, RNE rounding; compiled with --fmad=false.
//
// Append: grid (num_tokens), rows [num_tokens, num_heads, D] fp16 -> rotated fp16 rows into
//   pool[(slot * num_heads + head) * G + offset][D], slot/offset = pool_pos[token] / % G.
#ifndef KVARN_CUDA_STORE_CUH_
#define KVARN_CUDA_STORE_CUH_

#include <cuda_fp16.h>

#include <cstdint>

#include "kvarn/core/pack.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/core/reduce.hpp"
#include "kvarn/cuda/common.cuh"

namespace kvarn::cuda {

constexpr int kStoreThreads = 256;

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
  int hadamard;
  float rot_scale;
  int iters;
  float std_min, std_max, log_min, log_max, floor;
  // record layout (byte offsets)
  int k_codes, s_col_k, zp_k, s_row_k, v_codes, s_col_v, s_row_v, zp_v, end;
};

namespace detail {

__device__ __forceinline__ float clampf_ref(float x, float lo, float hi) {
  // std::min(std::max(x, lo), hi) for non-NaN x
  float y = x < lo ? lo : x;
  return hi < y ? hi : y;
}

// canonical_std over n elements produced by f(i), identical arithmetic to reduce.hpp.
template <typename F>
__device__ __forceinline__ float std_of(int n, F f) {
  float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < n; i += 8) {
#pragma unroll
    for (int j = 0; j < 8; ++j) p[j] += f(i + j);
  }
  const float mean = combine8(p) / static_cast<float>(n);
#pragma unroll
  for (int j = 0; j < 8; ++j) p[j] = 0.0f;
  for (int i = 0; i < n; i += 8) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float d = f(i + j) - mean;
      p[j] += d * d;
    }
  }
  return sqrt_rn(combine8(p) / static_cast<float>(n - 1));
}

// ratio(s) = max(s) / max(min(s), floor) by warp 0 (max/min are order independent).
__device__ __forceinline__ float ratio_warp(const float* s, int n, float floor) {
  const int lane = threadIdx.x & 31;
  float mx = s[0], mn = s[0];
  for (int i = lane; i < n; i += 32) {
    mx = fmaxf(mx, s[i]);
    mn = fminf(mn, s[i]);
  }
  for (int o = 16; o > 0; o >>= 1) {
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
  }
  return mx / fmaxf(mn, floor);
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

}  // namespace detail

template <int D, int G>
constexpr int store_smem_floats() {
  constexpr int kTile = (D > G ? D * (G + 1) : G * (D + 1));  // max of both orientations
  return kTile + 8 * (D > G ? D : G) + 8;
}

template <int D, int G>
__global__ void __launch_bounds__(kStoreThreads) kvarn_store_kernel(StoreArgs a) {
  extern __shared__ float smem[];
  const bool is_key = blockIdx.y == 0;
  const int R = is_key ? D : G, C = is_key ? G : D;
  const int ld = C + 1;
  float* x = smem;
  constexpr int kTile = (D > G ? D * (G + 1) : G * (D + 1));
  float* log_sc = smem + kTile;
  float* sc = log_sc + C;
  float* best_sc = sc + C;
  float* col_std = best_sc + C;
  float* log_sr = col_std + C;
  float* sr = log_sr + R;
  float* best_sr = sr + R;
  float* row_std = best_sr + R;
  float* misc = row_std + R;  // [0] best, [1] flag
  const int tid = threadIdx.x;

  const int tile = blockIdx.x;
  const int blk = tile / a.num_heads, head = tile % a.num_heads;
  const std::uint16_t* in = (is_key ? a.k : a.v) + blk * a.block_stride + head * a.head_stride;
  // element (token g, channel d) -> oriented address
  auto addr = [&](int g, int d) { return is_key ? d * ld + g : g * ld + d; };

  for (int i = tid; i < G * D; i += kStoreThreads) {
    const int g = i / D, d = i % D;
    x[addr(g, d)] = half_bits_to_float(in[g * a.row_stride + d]);
  }
  __syncthreads();
  if (a.hadamard) {
    for (int h = 1; h < D; h <<= 1) {
      for (int p = tid; p < G * D / 2; p += kStoreThreads) {
        const int g = p / (D / 2), q = p % (D / 2);
        const int j = (q / h) * 2 * h + q % h;
        const float u = x[addr(g, j)], w = x[addr(g, j + h)];
        x[addr(g, j)] = u + w;
        x[addr(g, j + h)] = u - w;
      }
      __syncthreads();
    }
    for (int i = tid; i < G * D; i += kStoreThreads) {
      const int g = i / D, d = i % D;
      x[addr(g, d)] = round_to_half(x[addr(g, d)] * a.rot_scale);
    }
  } else {
    for (int i = tid; i < G * D; i += kStoreThreads) {
      const int g = i / D, d = i % D;
      x[addr(g, d)] = round_to_half(x[addr(g, d)]);
    }
  }
  for (int c = tid; c < C; c += kStoreThreads) {
    log_sc[c] = 0.0f;
    sc[c] = 1.0f;
    best_sc[c] = 1.0f;
  }
  for (int r = tid; r < R; r += kStoreThreads) {
    log_sr[r] = 0.0f;
    sr[r] = 1.0f;
    best_sr[r] = 1.0f;
  }
  __syncthreads();

  // ---- VarN ----
  auto cur = [&](int r, int c) { return (x[r * ld + c] / sc[c]) / sr[r]; };
  for (int c = tid; c < C; c += kStoreThreads)
    col_std[c] = detail::std_of(R, [&](int r) { return x[r * ld + c]; });
  for (int r = tid; r < R; r += kStoreThreads)
    row_std[r] = detail::std_of(C, [&](int c) { return x[r * ld + c]; });
  __syncthreads();
  if (tid < 32) {
    const float rc = detail::ratio_warp(col_std, C, a.floor);
    const float rr = detail::ratio_warp(row_std, R, a.floor);
    if (tid == 0) misc[0] = rc + rr;
  }
  __syncthreads();
  for (int it = 1; it <= a.iters; ++it) {
    for (int c = tid; c < C; c += kStoreThreads) {
      log_sc[c] = detail::clampf_ref(
          log_sc[c] + portable_log(detail::clampf_ref(col_std[c], a.std_min, a.std_max)),
          a.log_min, a.log_max);
      sc[c] = portable_exp(log_sc[c]);
    }
    __syncthreads();
    for (int r = tid; r < R; r += kStoreThreads) {
      const float s = detail::std_of(C, [&](int c) { return cur(r, c); });
      log_sr[r] = detail::clampf_ref(
          log_sr[r] + portable_log(detail::clampf_ref(s, a.std_min, a.std_max)), a.log_min,
          a.log_max);
      sr[r] = portable_exp(log_sr[r]);  // only row r reads sr[r] in this loop
    }
    __syncthreads();
    for (int r = tid; r < R; r += kStoreThreads)
      row_std[r] = detail::std_of(C, [&](int c) { return cur(r, c); });
    for (int c = tid; c < C; c += kStoreThreads)
      col_std[c] = detail::std_of(R, [&](int r) { return cur(r, c); });
    __syncthreads();
    if (tid < 32) {
      const float rc = detail::ratio_warp(col_std, C, a.floor);
      const float rr = detail::ratio_warp(row_std, R, a.floor);
      const float imb = rc + rr;
      if (tid == 0) {
        const bool better = imb <= misc[0];
        if (better) misc[0] = imb;
        misc[1] = better ? 1.0f : 0.0f;
      }
    }
    __syncthreads();
    if (misc[1] != 0.0f) {
      for (int c = tid; c < C; c += kStoreThreads) best_sc[c] = sc[c];
      for (int r = tid; r < R; r += kStoreThreads) best_sr[r] = sr[r];
    }
    __syncthreads();
  }

  // ---- RTN per oriented row, pack, scale absorption ----
  const int bits = is_key ? a.key_bits : a.value_bits;
  const int pf = 8 / bits;
  const float qmax = static_cast<float>((1 << bits) - 1);
  const int row_bytes = C / pf;
  std::uint8_t* rec = a.records +
                      ((a.dst_block ? static_cast<long long>(a.dst_block[blk]) : blk) *
                           a.num_heads +
                       head) *
                          a.record_bytes;
  std::uint8_t* code_dst = rec + (is_key ? a.k_codes : a.v_codes);
  const int sb = a.fp8_scales ? 1 : 2;
  for (int r = tid; r < R; r += kStoreThreads) {
    auto bal = [&](int c) { return (x[r * ld + c] / best_sc[c]) / best_sr[r]; };
    float mn = bal(0), mx = mn;
    for (int c = 1; c < C; ++c) {
      const float v = bal(c);
      mn = fminf(mn, v);
      mx = fmaxf(mx, v);
    }
    const float s = fmaxf((mx - mn) / qmax, 1e-10f);
    for (int byte = 0; byte < row_bytes; ++byte) {
      unsigned acc = 0;
      for (int k = 0; k < pf; ++k) {
        float q = round_half_even((bal(byte * pf + k) - mn) / s);
        q = fminf(fmaxf(q, 0.0f), qmax);
        acc |= static_cast<unsigned>(q) << (k * bits);
      }
      code_dst[r * row_bytes + byte] = static_cast<std::uint8_t>(acc);
    }
    if (is_key) {  // rows = channels
      detail::store_scale(rec + a.s_col_k + r * sb, best_sr[r] * s, a.fp8_scales);
      detail::store_half(rec + a.zp_k + r * 2, best_sr[r] * mn);
    } else {  // rows = tokens
      detail::store_scale(rec + a.s_row_v + r * sb, best_sr[r] * s, a.fp8_scales);
      detail::store_half(rec + a.zp_v + r * 2, best_sr[r] * mn);
    }
  }
  for (int c = tid; c < C; c += kStoreThreads) {
    if (is_key) {
      detail::store_scale(rec + a.s_row_k + c * sb, best_sc[c], a.fp8_scales);
    } else {
      detail::store_scale(rec + a.s_col_v + c * sb, best_sc[c], a.fp8_scales);
    }
  }
  if (!is_key) {
    for (long long i = a.end + tid; i < a.record_bytes; i += kStoreThreads) rec[i] = 0;
  }
}

// ---- append: rotate + fp16 round new rows into the pool ----
struct AppendArgs {
  const std::uint16_t* k;  // [n, H, D]
  const std::uint16_t* v;
  const long long* pool_pos;  // [n]: slot * G + offset
  std::uint16_t* k_pool;      // [slots, H, G, D]
  std::uint16_t* v_pool;
  int num_heads, group, hadamard;
  float rot_scale;
};

template <int D>
__global__ void __launch_bounds__(128) kvarn_append_kernel(AppendArgs a) {
  extern __shared__ float buf[];  // [2][H][D]
  const int tok = blockIdx.x, H = a.num_heads, n = 2 * H * D;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int s = i / (H * D), rest = i % (H * D);
    const std::uint16_t* src = (s == 0 ? a.k : a.v) + static_cast<long long>(tok) * H * D;
    buf[i] = half_bits_to_float(src[rest]);
  }
  __syncthreads();
  if (a.hadamard) {
    for (int h = 1; h < D; h <<= 1) {
      for (int p = threadIdx.x; p < n / 2; p += blockDim.x) {
        const int row = p / (D / 2), q = p % (D / 2);
        const int j = row * D + (q / h) * 2 * h + q % h;
        const float u = buf[j], w = buf[j + h];
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
    const float val = a.hadamard ? buf[i] * a.rot_scale : buf[i];
    std::uint16_t* dst = s == 0 ? a.k_pool : a.v_pool;
    dst[((slot * H + head) * a.group + off) * D + d] = float_to_half_bits(val);
  }
}

}  // namespace kvarn::cuda

#endif  // KVARN_CUDA_STORE_CUH_
