// Internal: decode kernel launch for one (format, key bits, value bits) instantiation set.
#ifndef KVARN_CUDA_SRC_DECODE_LAUNCH_CUH_
#define KVARN_CUDA_SRC_DECODE_LAUNCH_CUH_

#include <algorithm>

#include "kvarn/cuda/decode.cuh"

namespace kvarn::cuda::detail {

struct LaunchShape {
  int head_dim, group, qpk, num_splits, batch, num_kv_heads;
  long long record_bytes;
};

template <KvFormat F, int KB, int VB>
void launch_decode(const DecodeArgs& a, const LaunchShape& s, cudaStream_t stream) {
  DISPATCH_HEAD_DIM(s.head_dim, kD, {
    DISPATCH_GROUP_DECODE(s.group, kG, {
      DISPATCH_QPK(s.qpk, kQP, {
        using T = DecodeTraits<kD, kG, KB, VB, kQP, F>;
        const long long rec = F == KvFormat::kKvarn ? 2 * ((s.record_bytes + 15) / 16 * 16) : 0;
        const long long smem = T::kFloatBytes + std::max<long long>(rec, T::kReduceBytes);
        auto kernel = paged_decode_kernel<kD, kG, KB, VB, kQP, F>;
        KVARN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(smem)));
        kernel<<<dim3(s.num_splits, s.num_kv_heads, s.batch), kDecodeThreads, smem, stream>>>(a);
        KVARN_CUDA_CHECK_LAUNCH();
      })
    })
  })
}

// Per-file entry points (return false when the bit pair is not compiled in that file).
bool launch_kvarn_k4(int kb, int vb, const DecodeArgs& a, const LaunchShape& s, cudaStream_t st);
bool launch_kvarn_other(int kb, int vb, const DecodeArgs& a, const LaunchShape& s,
                        cudaStream_t st);
void launch_fp(KvFormat f, const DecodeArgs& a, const LaunchShape& s, cudaStream_t st);

}  // namespace kvarn::cuda::detail

#endif  // KVARN_CUDA_SRC_DECODE_LAUNCH_CUH_
