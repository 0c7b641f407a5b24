// Paged decode host entry: argument checks, split choice, kernel + combine launch.
#include <algorithm>
#include <cmath>

#include "decode_launch.cuh"
#include "kvarn/cuda/api.hpp"
#include "kvarn/data/error.hpp"

namespace kvarn::cuda {

int decode_num_splits(const DecodeProblem& p) {
  if (p.num_splits > 0) return p.num_splits;
  int sms = 132;
  int dev = 0;
  if (cudaGetDevice(&dev) == cudaSuccess) {
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  } else {
    (void)cudaGetLastError();
  }
  const long long ctas = static_cast<long long>(p.batch) * p.num_kv_heads;
  const long long target = 8LL * sms;  // about two waves of 4 CTAs per SM
  long long s = (target + ctas - 1) / ctas;
  s = std::min<long long>(s, std::max(1, (p.max_blocks + 1) / 2));
  return static_cast<int>(std::max<long long>(1, std::min<long long>(s, 256)));
}

std::size_t decode_workspace_bytes(const DecodeProblem& p) {
  const std::size_t rows = static_cast<std::size_t>(p.batch) * p.num_q_heads;
  const std::size_t s = static_cast<std::size_t>(decode_num_splits(p));
  return rows * s * (static_cast<std::size_t>(p.head_dim) + 1) * sizeof(float);
}

void paged_decode(const DecodeProblem& p, const DecodeBuffers& b, cudaStream_t stream) {
  KVARN_CHECK(p.num_kv_heads > 0 && p.num_q_heads % p.num_kv_heads == 0,
              "paged_decode: Hq ", p.num_q_heads, " not a multiple of Hkv ", p.num_kv_heads);
  KVARN_CHECK(b.workspace != nullptr, "paged_decode: workspace required");
  if (p.batch == 0) return;
  const int splits = decode_num_splits(p);
  const int qpk = p.num_q_heads / p.num_kv_heads;
  DecodeArgs a{};
  a.q = reinterpret_cast<const __half*>(b.q);
  a.block_table = b.block_table;
  a.max_blocks = p.max_blocks;
  a.seq_lens = b.seq_lens;
  a.records = b.records;
  a.block_to_slot = b.block_to_slot;
  a.k_pool = b.k_pool;
  a.v_pool = b.v_pool;
  a.k_scale = b.k_scale;
  a.v_scale = b.v_scale;
  a.num_q_heads = p.num_q_heads;
  a.num_kv_heads = p.num_kv_heads;
  a.qpk = qpk;
  a.num_splits = splits;
  const float sm = p.softmax_scale > 0 ? p.softmax_scale
                                       : static_cast<float>(1.0 / std::sqrt(double(p.head_dim)));
  a.qk_scale = sm * 1.4426950408889634f;
  a.o_part = static_cast<float*>(b.workspace);
  a.lse = a.o_part + static_cast<std::size_t>(p.batch) * p.num_q_heads * splits * p.head_dim;
  detail::LaunchShape s{p.head_dim, p.block_size, qpk, splits, p.batch, p.num_kv_heads, 0};
  if (p.format == DecodeFormat::kKvarn) {
    const KvarnConfig& c = p.kvarn;
    KVARN_CHECK(c.group == p.block_size, "paged_decode: block_size must equal the KVarN group");
    KVARN_CHECK(c.rotation == RotationKind::kHadamard || c.rotation == RotationKind::kNone,
                "paged_decode: rotation not supported on the GPU");
    const KvarnRecordLayout lay = kvarn_record_layout(p.head_dim, c);
    a.record_bytes = static_cast<long long>(lay.aligned);
    a.rot_scale = c.rotation == RotationKind::kHadamard
                      ? static_cast<float>(1.0 / std::sqrt(double(p.head_dim)))
                      : 0.0f;
    a.fp8_scales = c.scales == ScaleStorage::kFp8E4M3 ? 1 : 0;
    a.s_col_k = static_cast<int>(lay.s_col_k);
    a.zp_k = static_cast<int>(lay.zp_k);
    a.s_row_k = static_cast<int>(lay.s_row_k);
    a.v_codes = static_cast<int>(lay.v_codes);
    a.s_col_v = static_cast<int>(lay.s_col_v);
    a.s_row_v = static_cast<int>(lay.s_row_v);
    a.zp_v = static_cast<int>(lay.zp_v);
    s.record_bytes = a.record_bytes;
    if (!detail::launch_kvarn_k4(c.key_bits, c.value_bits, a, s, stream) &&
        !detail::launch_kvarn_other(c.key_bits, c.value_bits, a, s, stream)) {
      fail("paged_decode: KVarN k", c.key_bits, "v", c.value_bits,
           " not compiled (k4v2, k4v4, k2v2, k8v8, k3v2)");
    }
  } else {
    a.rot_scale = 0.0f;
    detail::launch_fp(p.format == DecodeFormat::kFp16 ? KvFormat::kFp16 : KvFormat::kFp8, a, s,
                      stream);
  }
  const int rot_scale_bits = 0;
  (void)rot_scale_bits;
  DISPATCH_HEAD_DIM(p.head_dim, kD, {
    combine_kernel<kD><<<dim3(p.num_q_heads, p.batch), kD, 0, stream>>>(
        a.o_part, a.lse, p.num_q_heads, splits, a.rot_scale, reinterpret_cast<__half*>(b.out));
    KVARN_CUDA_CHECK_LAUNCH();
  })
}

}  // namespace kvarn::cuda
