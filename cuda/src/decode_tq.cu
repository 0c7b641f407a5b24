// TurboQuant decode: centroid tables from core's codebook, launch of the split kernel.
#include <algorithm>

#include "decode_launch.cuh"
#include "decode_tq.cuh"
#include "kvarn/core/lloyd_max.hpp"
#include "kvarn/core/portable_math.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn::cuda::detail {

void fill_tq_tables(int head_dim, int key_bits, TqDecodeArgs& a) {
  for (int i = 0; i < 4; ++i) a.tab_lo[i] = a.tab_hi[i] = 0;
  if (key_bits == 8) return;
  const ScalarCodebook& cb = vllm_turboquant_codebook(head_dim, key_bits);
  for (int i = 0; i < static_cast<int>(cb.centroids.size()); ++i) {
    const std::uint16_t hb = float_to_half_bits(cb.centroids[i]);
    a.tab_lo[i / 4] |= static_cast<std::uint32_t>(hb & 0xff) << (8 * (i % 4));
    a.tab_hi[i / 4] |= static_cast<std::uint32_t>(hb >> 8) << (8 * (i % 4));
  }
}

namespace {
template <int D, int KB, int VB, bool NC, int W, bool kPair>
void launch_tq_w(const TqDecodeArgs& a, const LaunchShape& s, cudaStream_t stream) {
  using T = TqTraits<D, KB, VB, W>;
  auto kernel = paged_decode_tq_kernel<D, KB, VB, NC, W, kPair>;
  static DeviceSmemLimit smem_set;  // per instantiation and device
  smem_set.raise(kernel, T::kSmemBytes);
  // warp w of CTA x: item stream x W + w of batch x Hkv x splits
  const long long streams = static_cast<long long>(s.batch) * s.num_kv_heads * s.num_splits;
  const long long ctas = (streams + W - 1) / W;
  KVARN_CHECK(ctas < (1LL << 31), "paged_decode: TurboQuant grid of ", ctas, " CTAs");
  kernel<<<static_cast<unsigned>(ctas), 32 * W, T::kSmemBytes, stream>>>(a);
  KVARN_CUDA_CHECK_LAUNCH("paged_decode_tq_kernel");
}

template <int D, int KB, int VB, bool NC, bool kPair>
void launch_tq_pair(const TqDecodeArgs& a, const LaunchShape& s, cudaStream_t stream) {
  static_assert(sizeof(kTqCompiledWarps) == 3 * sizeof(int), "one branch per compiled count");
  if (s.warps == 8) {
    launch_tq_w<D, KB, VB, NC, 8, kPair>(a, s, stream);
  } else if (s.warps == 4) {
    launch_tq_w<D, KB, VB, NC, 4, kPair>(a, s, stream);
  } else {
    launch_tq_w<D, KB, VB, NC, 1, kPair>(a, s, stream);
  }
}

// At most kPairHeads query heads per KV head and splits of at least kTqPairMinTokens tokens: two
// items per step (the kPair instances). Below, a split is one or two steps either way, and the
// paired first step waits for both items (H200, batch 1 x 2K, 64 splits: 0.96-0.98x paired).
constexpr long long kTqPairMinTokens = 64;
template <int D, int KB, int VB, bool NC>
void launch_tq_nc(const TqDecodeArgs& a, const LaunchShape& s, cudaStream_t stream) {
  // (from the block table's width, as the split count itself)
  const int splits = std::max(a.num_splits, 1);
  const long long split_tokens =
      static_cast<long long>((a.max_blocks + splits - 1) / splits) * a.page;
  if (a.qpk <= kPairHeads && split_tokens >= kTqPairMinTokens) {
    launch_tq_pair<D, KB, VB, NC, true>(a, s, stream);
  } else {
    launch_tq_pair<D, KB, VB, NC, false>(a, s, stream);
  }
}

template <int KB, int VB>
void launch_tq(const TqDecodeArgs& a, int head_dim, const LaunchShape& s, cudaStream_t stream) {
  DISPATCH_HEAD_DIM(head_dim, kD, {
    if constexpr (KB == 8) {  // fp8 keys: no norm correction (paged_decode refuses nc)
      launch_tq_nc<kD, KB, VB, false>(a, s, stream);
    } else if (a.nc) {
      launch_tq_nc<kD, KB, VB, true>(a, s, stream);
    } else {
      launch_tq_nc<kD, KB, VB, false>(a, s, stream);
    }
  })
}
}  // namespace

bool launch_turboquant(int kb, int vb, const TqDecodeArgs& a, int head_dim, const LaunchShape& s,
                       cudaStream_t st) {
#define KVARN_DECODE_TQ_DISPATCH_(KB, VB) \
  if (kb == KB && vb == VB) {             \
    launch_tq<KB, VB>(a, head_dim, s, st); \
    return true;                          \
  }
  KVARN_DECODE_TQ_INSTANCES(KVARN_DECODE_TQ_DISPATCH_)
#undef KVARN_DECODE_TQ_DISPATCH_
  return false;
}

}  // namespace kvarn::cuda::detail
