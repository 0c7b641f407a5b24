// The one table of compiled paged-decode kernel instances. Every consumer expands it: the
// explicit instantiations (cuda/src/decode_instances.cu, one translation unit per `unit` so they
// compile in parallel), the host dispatch (cuda/src/decode.cu), the paged-cache support check
// (cuda/src/paged_cache.cpp) and the GPU test case lists (tests/cuda). Adding a KVarN or
// TurboQuant bit pair is one line here. Each instance is compiled for every head dim of
// DISPATCH_HEAD_DIM (64, 128) and every group / page of DISPATCH_GROUP_DECODE (32, 64, 128) in
// cuda/src/common.cuh (TurboQuant: pages that are multiples of 16, D 64 and 128).
#ifndef KVARN_CUDA_DECODE_INSTANCES_HPP_
#define KVARN_CUDA_DECODE_INSTANCES_HPP_

#include <string>

#include "kvarn/cuda/api.hpp"

// X(format, key bits, value bits, unit, warps); format names an enumerator of both DecodeFormat
// and the kernels' KvFormat (kKvarn, kFp16, kFp8); unit: the translation unit that compiles it;
// warps: KVarN G 128 warps per CTA (1 or 2; both are compiled) for a cache of more than a few
// records per SM split a few ways (cuda/src/decode.cu: g128_warps takes 2 for fewer records and
// past 16 one-warp splits, 24 for k4v4, whose one-warp kernel streams records in pieces and takes
// 1 where a split holds 8 or more records). One warp does a record's per-record work once; two
// hide more latency. H200, Hq 32/64, Hkv 8, batch 8-32, 16K-128K: k4v2 faster on 1 warp, k4v4 on
// 2 with whole records and on 1 in pieces (docs/PERFORMANCE.md).
// FP16 / FP8 rows: unused (2).
#define KVARN_DECODE_INSTANCES(X) \
  X(kKvarn, 4, 2, kvarn_k4, 1)    \
  X(kKvarn, 4, 4, kvarn_k4, 2)    \
  X(kKvarn, 2, 2, kvarn_other, 1) \
  X(kKvarn, 8, 8, kvarn_other, 1) \
  X(kKvarn, 3, 2, kvarn_other, 1) \
  X(kFp16, 8, 8, fp, 2)           \
  X(kFp8, 8, 8, fp, 2)

// TurboQuant (vLLM presets): X(key bits, value bits); with and without norm correction (nc,
// chosen at run time) for Lloyd-Max keys.
#define KVARN_DECODE_TQ_INSTANCES(X) \
  X(4, 4)                            \
  X(3, 3)                            \
  X(8, 4)

namespace kvarn::cuda {

// TurboQuant warps per CTA, each compiled for every instance: each warp works its own split, the
// CTA's warps share the key centroid table (cuda/src/decode_tq.cuh; DecodeProblem::warps picks
// one, 0 the automatic choice of decode_num_warps).
inline constexpr int kTqCompiledWarps[] = {1, 4, 8};

struct DecodeInstance {
  DecodeFormat format;
  int key_bits, value_bits;
  int g128_warps;  // KVarN G 128 warps per CTA on a full device (TurboQuant: 1)
};

// The table as data (TurboQuant rows carry DecodeFormat::kTurboQuant).
#define KVARN_DECODE_INSTANCE_ROW_(format, kb, vb, unit, warps) \
  DecodeInstance{DecodeFormat::format, kb, vb, warps},
#define KVARN_DECODE_TQ_ROW_(kb, vb) DecodeInstance{DecodeFormat::kTurboQuant, kb, vb, 1},
inline constexpr DecodeInstance kDecodeInstances[] = {
    KVARN_DECODE_INSTANCES(KVARN_DECODE_INSTANCE_ROW_)
        KVARN_DECODE_TQ_INSTANCES(KVARN_DECODE_TQ_ROW_)};
#undef KVARN_DECODE_INSTANCE_ROW_
#undef KVARN_DECODE_TQ_ROW_

// True when the table compiles `format` for (key bits, value bits) (FP16 / FP8: 8, 8).
constexpr bool decode_compiled(DecodeFormat format, int key_bits, int value_bits) {
  for (const DecodeInstance& i : kDecodeInstances)
    if (i.format == format && i.key_bits == key_bits && i.value_bits == value_bits) return true;
  return false;
}

// The table's G 128 warps per CTA of `format` (kb, vb); 0 when it is not compiled.
constexpr int decode_table_warps(DecodeFormat format, int key_bits, int value_bits) {
  for (const DecodeInstance& i : kDecodeInstances)
    if (i.format == format && i.key_bits == key_bits && i.value_bits == value_bits)
      return i.g128_warps;
  return 0;
}

// "k4v2, k4v4, ..." of one format, for messages.
std::string decode_compiled_list(DecodeFormat format);

}  // namespace kvarn::cuda

#endif  // KVARN_CUDA_DECODE_INSTANCES_HPP_
