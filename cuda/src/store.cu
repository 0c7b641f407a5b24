// KVarN store and append launchers. Compiled with --fmad=false (bit-identity with the CPU).
#include <cmath>
#include <cstdint>
#include <limits>

#include "kvarn/core/hadamard_fp16.hpp"
#include "kvarn/core/kvarn.hpp"
#include "kvarn/core/rotation.hpp"
#include "kvarn/core/varn.hpp"
#include "kvarn/cuda/api.hpp"
#include "kvarn/data/error.hpp"
#include "store.cuh"
#include "store_spread.cuh"

namespace kvarn::cuda {

namespace {
float hadamard_scale(int d) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(d))); }

// StoreArgs::hadamard: 0 none, 1 exact-scale fp32 FWHT, 2 the published fp16 matrix.
int rotation_mode(RotationKind r) {
  return r == RotationKind::kHadamardFp16 ? 2 : r == RotationKind::kHadamard ? 1 : 0;
}

void check_config(const KvarnConfig& cfg, int head_dim) {
  KVARN_CHECK(cfg.rotation == RotationKind::kHadamardFp16 ||
                  cfg.rotation == RotationKind::kHadamard || cfg.rotation == RotationKind::kNone,
              "kvarn_cuda: rotation ", kvarn_rotation_name(cfg.rotation),
              " not supported on the GPU");
  KVARN_CHECK(head_dim == 64 || head_dim == 128, "kvarn_cuda: head_dim ", head_dim,
              " not supported (64, 128)");
  KVARN_CHECK(cfg.rtn_quantile == 0.0f, "kvarn_cuda: RTN quantile must be 0 on the GPU");
  KVARN_CHECK(cfg.key_bits >= 1 && cfg.key_bits <= 8 && cfg.value_bits >= 1 && cfg.value_bits <= 8,
              "kvarn_cuda: bits must be 1..8");
}

// The cluster kernel spreads a tile stream's latency over 8 SMs and wins while the launch leaves
// the SMs mostly idle: at most 5 of its CTAs per SM. On the H200 at D 128 / G 128 (one launch,
// events around it) it took 47 / 66 / 79 / 87 us at 8 / 32 / 40 / 48 tiles, the one-CTA kernel
// 82 us at each.
bool use_cluster_store(int num_tiles) {
  return static_cast<long long>(num_tiles) * 2 * kStoreClusterSize <= 5LL * sm_count() &&
         cluster_launch_supported();
}

void launch_store(void (*kernel)(StoreArgs), dim3 grid, int threads, int smem, const StoreArgs& a,
                  cudaStream_t stream) {
  KVARN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<grid, threads, smem, stream>>>(a);
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

void kvarn_store(const KvarnConfig& cfg, int head_dim, const StoreTiles& t, cudaStream_t stream) {
  check_config(cfg, head_dim);
  if (t.num_tiles == 0) return;
  const KvarnRecordLayout lay = kvarn_record_layout(head_dim, cfg);
  StoreArgs a{};
  a.k = t.k;
  a.v = t.v;
  a.block_stride = t.block_stride;
  a.head_stride = t.head_stride;
  a.row_stride = t.row_stride;
  a.num_heads = t.num_heads;
  a.dst_block = t.dst_block;
  a.records = t.records;
  a.record_bytes = static_cast<long long>(lay.aligned);
  a.key_bits = cfg.key_bits;
  a.value_bits = cfg.value_bits;
  a.fp8_scales = cfg.scales == ScaleStorage::kFp8E4M3 ? 1 : 0;
  a.hadamard = rotation_mode(cfg.rotation);
  a.rot_scale = hadamard_scale(head_dim);
  a.rot_c = fp16_scale(hadamard_fp16_scale_bits(head_dim));
  a.overflow = t.overflow;
  a.iters = cfg.varn.iters;
  a.std_min = cfg.varn.std_min;
  a.std_max = cfg.varn.std_max;
  a.log_min = cfg.varn.log_min;
  a.log_max = cfg.varn.log_max;
  a.floor = cfg.varn.imbalance_floor;
  const VarnDivisionBounds div = varn_division_bounds(cfg.varn);
  a.div_lo = div.lo;
  a.div_hi = div.hi;
  auto aligned16 = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; };
  a.rows_16b = aligned16(t.k) && aligned16(t.v) && t.row_stride % 8 == 0 &&
               t.head_stride % 8 == 0 && t.block_stride % 8 == 0;
  a.k_codes = static_cast<int>(lay.k_codes);
  a.s_col_k = static_cast<int>(lay.s_col_k);
  a.zp_k = static_cast<int>(lay.zp_k);
  a.s_row_k = static_cast<int>(lay.s_row_k);
  a.v_codes = static_cast<int>(lay.v_codes);
  a.s_col_v = static_cast<int>(lay.s_col_v);
  a.s_row_v = static_cast<int>(lay.s_row_v);
  a.zp_v = static_cast<int>(lay.zp_v);
  a.end = static_cast<int>(lay.end);
  const bool cluster = t.kernel == StoreKernel::kCluster ||
                       (t.kernel == StoreKernel::kAuto && use_cluster_store(t.num_tiles));
  KVARN_CHECK(!cluster || t.num_tiles <= std::numeric_limits<int>::max() / kStoreClusterSize,
              "kvarn_store: ", t.num_tiles, " tiles exceed the cluster kernel's grid");
  DISPATCH_HEAD_DIM(
      head_dim, kD, {DISPATCH_GROUP_STORE(cfg.group, kG, {
        if (cluster) {
          launch_store(kvarn_store_spread_kernel<kD, kG>, dim3(t.num_tiles * kStoreClusterSize, 2),
                       spread_threads<kD, kG>(), spread_smem_bytes<kD, kG>(), a, stream);
          KVARN_CUDA_CHECK_LAUNCH("kvarn_store_spread_kernel");
        } else {
          launch_store(kvarn_store_kernel<kD, kG>, dim3(t.num_tiles, 2), store_threads<kD, kG>(),
                       store_smem_bytes<kD, kG>(), a, stream);
          KVARN_CUDA_CHECK_LAUNCH("kvarn_store_kernel");
        }
      })})
}

void kvarn_append(const KvarnConfig& cfg, int head_dim, int num_tokens, int num_heads,
                  const std::uint16_t* k, const std::uint16_t* v, const long long* pool_pos,
                  std::uint16_t* k_pool, std::uint16_t* v_pool, cudaStream_t stream) {
  check_config(cfg, head_dim);
  if (num_tokens == 0) return;
  AppendArgs a{k,
               v,
               pool_pos,
               k_pool,
               v_pool,
               num_heads,
               cfg.group,
               rotation_mode(cfg.rotation),
               hadamard_scale(head_dim),
               fp16_scale(hadamard_fp16_scale_bits(head_dim))};
  const bool exact = a.hadamard == 2;
  DISPATCH_HEAD_DIM(head_dim, kD, {
    const int smem = 2 * num_heads * kD * (exact ? 8 : 4);
    auto kernel = exact ? kvarn_append_kernel<kD, long long> : kvarn_append_kernel<kD, float>;
    KVARN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    kernel<<<num_tokens, 128, smem, stream>>>(a);
    KVARN_CUDA_CHECK_LAUNCH("kvarn_append_kernel");
  })
}

}  // namespace kvarn::cuda
