// PagedCache's one kernel: scatter new fp16 rows [Hkv, n, D] into FP16 / FP8 pages
// [blocks, Hkv, P, D] (block = token / P). FP8 bytes are float_to_fp8_bits(x / scale), the same
// RNE conversion and fp32 division as core's fp8 codec.
#include <cuda_fp16.h>

#include <cstdint>

#include "kvarn/core/portable_math.hpp"
#include "kvarn/cuda/error.hpp"

namespace kvarn::cuda::detail {

namespace {

template <bool kFp8>
__global__ void scatter_pages_kernel(const std::uint16_t* k, const std::uint16_t* v, int n,
                                     int first, int d, int page, float scale, void* k_pages,
                                     void* v_pages) {
  const int i = blockIdx.x, h = blockIdx.y, hkv = gridDim.y;
  const int t = first + i, blk = t / page, off = t % page;
  const long long src = (static_cast<long long>(h) * n + i) * d;
  const long long dst = ((static_cast<long long>(blk) * hkv + h) * page + off) * d;
  for (int x = threadIdx.x; x < d; x += blockDim.x) {
    if constexpr (kFp8) {
      const float kf = __half2float(__ushort_as_half(k[src + x]));
      const float vf = __half2float(__ushort_as_half(v[src + x]));
      static_cast<std::uint8_t*>(k_pages)[dst + x] =
          float_to_fp8_bits(kf / scale, Fp8Format::kE4M3);
      static_cast<std::uint8_t*>(v_pages)[dst + x] =
          float_to_fp8_bits(vf / scale, Fp8Format::kE4M3);
    } else {
      static_cast<std::uint16_t*>(k_pages)[dst + x] = k[src + x];
      static_cast<std::uint16_t*>(v_pages)[dst + x] = v[src + x];
    }
  }
}

}  // namespace

void launch_page_scatter(bool fp8, const std::uint16_t* k, const std::uint16_t* v, int n, int first,
                         int num_kv_heads, int d, int page, float scale, void* k_pages,
                         void* v_pages, cudaStream_t stream) {
  if (n == 0) return;
  const dim3 grid(n, num_kv_heads);
  if (fp8) {
    scatter_pages_kernel<true>
        <<<grid, 128, 0, stream>>>(k, v, n, first, d, page, scale, k_pages, v_pages);
  } else {
    scatter_pages_kernel<false>
        <<<grid, 128, 0, stream>>>(k, v, n, first, d, page, scale, k_pages, v_pages);
  }
  KVARN_CUDA_CHECK_LAUNCH("scatter_pages_kernel");
}

}  // namespace kvarn::cuda::detail
