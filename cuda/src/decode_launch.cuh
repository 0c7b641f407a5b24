// Internal: decode kernel launch for one (format, key bits, value bits) instantiation set.
#ifndef KVARN_CUDA_SRC_DECODE_LAUNCH_CUH_
#define KVARN_CUDA_SRC_DECODE_LAUNCH_CUH_

#include <algorithm>
#include <mutex>

#include "decode.cuh"
#include "decode_tq.cuh"
#include "kvarn/cuda/decode_instances.hpp"
#include "kvarn/cuda/error.hpp"

namespace kvarn::cuda::detail {

// The dynamic shared-memory limit of one kernel, raised once per device to what a launch needs
// (the attribute is per device: a process may launch on several).
class DeviceSmemLimit {
 public:
  template <typename Kernel>
  void raise(Kernel kernel, int smem) {
    const int dev = current_device();
    if (dev >= kMaxDevices) {  // not cached
      KVARN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (smem > set_[dev]) {
      KVARN_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      set_[dev] = smem;
    }
  }

 private:
  static constexpr int kMaxDevices = 64;
  std::mutex mu_;
  int set_[kMaxDevices] = {};
};

struct LaunchShape {
  int head_dim, group, num_splits, batch, num_kv_heads;
  int warps;  // warps per CTA: decode_warps(format, group, the host's G 128 choice)
  int* ctas_per_sm = nullptr;  // set: report the kernel's resident CTAs per SM, launch nothing
};

// What a stage must hold besides row items: a KVarN record of record_bytes, its value part
// starting at v_codes (0 for FP16 / FP8).
struct StageRecord {
  long long record_bytes = 0, v_codes = 0;
  int key_bits = 0, value_bits = 0;  // record_in_pieces
};

// Bytes of one pipeline stage and of the kernel's dynamic shared memory.
inline int round128(long long x) { return static_cast<int>((x + 127) / 128 * 128); }
// (warps: per CTA, decode_warps of the problem; the row item holds 16 tokens per warp for KVarN;
// a record in pieces needs the larger of its two parts)
template <KvFormat F>
int stage_bytes_for(int head_dim, int group, int warps, StageRecord r) {
  int row = 0;
  DISPATCH_HEAD_DIM(head_dim, kD, { row = row_item_bytes<kD, F>(warps); })
  if constexpr (F == KvFormat::kKvarn) {
    const long long item = record_in_pieces(F, head_dim, group, r.key_bits, r.value_bits, warps)
                               ? std::max(r.v_codes, r.record_bytes - r.v_codes)
                               : r.record_bytes;
    return round128(std::max<long long>(item, row));
  }
  return round128(row);
}
template <KvFormat F>
constexpr int stages_for() {
  return DecodeTraits<128, 64, F, 8, 8, 2>::kStages;  // the same for every group and warp count
}
inline int decode_stage_bytes(KvFormat f, int head_dim, int group, int warps, StageRecord r) {
  switch (f) {
    case KvFormat::kKvarn:
      return stage_bytes_for<KvFormat::kKvarn>(head_dim, group, warps, r);
    case KvFormat::kFp16:
      return stage_bytes_for<KvFormat::kFp16>(head_dim, group, warps, r);
    default:
      return stage_bytes_for<KvFormat::kFp8>(head_dim, group, warps, r);
  }
}
inline int decode_smem_bytes(KvFormat f, int head_dim, int group, int warps, StageRecord r) {
  const int stages = f == KvFormat::kKvarn  ? stages_for<KvFormat::kKvarn>()
                     : f == KvFormat::kFp16 ? stages_for<KvFormat::kFp16>()
                                            : stages_for<KvFormat::kFp8>();
  return 128 + stages * decode_stage_bytes(f, head_dim, group, warps, r);
}

template <int D, int G, KvFormat F, int KB, int VB, int W, bool kSpread = false, bool kPair = false>
void launch_decode_warps(const DecodeArgs& a, const LaunchShape& s, cudaStream_t stream) {
  const int smem = 128 + DecodeTraits<D, G, F, KB, VB, W>::kStages * a.stage_bytes;
  auto kernel = paged_decode_kernel<D, G, F, KB, VB, W, kSpread, kPair>;
  static DeviceSmemLimit smem_set;  // per instantiation and device
  smem_set.raise(kernel, smem);
  if (s.ctas_per_sm != nullptr) {  // registers and shared memory both count
    KVARN_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(s.ctas_per_sm, kernel, 32 * W, smem));
    return;
  }
  kernel<<<dim3(s.num_splits, s.num_kv_heads, s.batch), 32 * W, smem, stream>>>(a);
  KVARN_CUDA_CHECK_LAUNCH("paged_decode_kernel");
}

template <int D, KvFormat F, int KB, int VB, bool kPair>
void launch_decode_g128(const DecodeArgs& a, const LaunchShape& s, cudaStream_t stream) {
  if (s.warps == 2 && a.sink_blocks > 0) {
    launch_decode_warps<D, 128, F, KB, VB, 2, true, kPair>(a, s, stream);
  } else if (s.warps == 2) {
    launch_decode_warps<D, 128, F, KB, VB, 2, false, kPair>(a, s, stream);
  } else if (a.sink_blocks > 0) {
    launch_decode_warps<D, 128, F, KB, VB, 1, true, kPair>(a, s, stream);
  } else {
    launch_decode_warps<D, 128, F, KB, VB, 1, false, kPair>(a, s, stream);
  }
}

template <KvFormat F, int KB, int VB>
void launch_decode(const DecodeArgs& a, const LaunchShape& s, cudaStream_t stream) {
  DISPATCH_HEAD_DIM(s.head_dim, kD, {
    DISPATCH_GROUP_DECODE(s.group, kG, {
      if constexpr (F == KvFormat::kKvarn && kG == 128) {
        // both warp counts, both spreads, query heads per KV head paired (<= 4) or not
        if (a.qpk <= kPairHeads) {
          launch_decode_g128<kD, F, KB, VB, true>(a, s, stream);
        } else {
          launch_decode_g128<kD, F, KB, VB, false>(a, s, stream);
        }
      } else {
        launch_decode_warps<kD, kG, F, KB, VB, decode_warps(F, kG, 1)>(a, s, stream);
      }
    })
  })
}

// TurboQuant: slot bytes (the stage and shared-memory sizes are in decode_tq.cuh).
inline int tq_slot_bytes(int head_dim, int kb, int vb) {
  const int key = kb == 8 ? head_dim : head_dim * kb / 8 + 2;
  return (key + head_dim * vb / 8 + 4 + 1) / 2 * 2;
}
void fill_tq_tables(int head_dim, int key_bits, TqDecodeArgs& a);
bool launch_turboquant(int kb, int vb, const TqDecodeArgs& a, int head_dim, const LaunchShape& s,
                       cudaStream_t st);

// Launches the table's instance (format, kb, vb) (FP16 / FP8: 8, 8); false when it is not in
// the table (kvarn/cuda/decode_instances.hpp).
bool launch_decode_instance(KvFormat f, int kb, int vb, const DecodeArgs& a, const LaunchShape& s,
                            cudaStream_t st);

// The instantiations live in their units (decode_unit_<unit>.cu): none here.
#define KVARN_DECODE_EXTERN_(format, kb, vb, unit, warps)                           \
  extern template void launch_decode<KvFormat::format, kb, vb>(const DecodeArgs&, \
                                                                const LaunchShape&, cudaStream_t);
KVARN_DECODE_INSTANCES(KVARN_DECODE_EXTERN_)
#undef KVARN_DECODE_EXTERN_

}  // namespace kvarn::cuda::detail

#endif  // KVARN_CUDA_SRC_DECODE_LAUNCH_CUH_
