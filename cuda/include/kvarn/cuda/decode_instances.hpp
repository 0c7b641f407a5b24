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

// X(format, key bits, value bits, unit); format names an enumerator of both DecodeFormat and the
// kernels' KvFormat (kKvarn, kFp16, kFp8); unit: the translation unit that compiles it.
#define KVARN_DECODE_INSTANCES(X) \
  X(kKvarn, 4, 2, kvarn_k4)       \
  X(kKvarn, 4, 4, kvarn_k4)       \
  X(kKvarn, 2, 2, kvarn_other)    \
  X(kKvarn, 8, 8, kvarn_other)    \
  X(kKvarn, 3, 2, kvarn_other)    \
  X(kFp16, 8, 8, fp)              \
  X(kFp8, 8, 8, fp)

// TurboQuant (vLLM presets): X(key bits, value bits); nc is a run-time flag.
#define KVARN_DECODE_TQ_INSTANCES(X) \
  X(4, 4)                            \
  X(3, 3)                            \
  X(8, 4)

namespace kvarn::cuda {

struct DecodeInstance {
  DecodeFormat format;
  int key_bits, value_bits;
};

// The table as data (TurboQuant rows carry DecodeFormat::kTurboQuant).
#define KVARN_DECODE_INSTANCE_ROW_(format, kb, vb, unit) DecodeInstance{DecodeFormat::format, kb, vb},
#define KVARN_DECODE_TQ_ROW_(kb, vb) DecodeInstance{DecodeFormat::kTurboQuant, kb, vb},
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

// "k4v2, k4v4, ..." of one format, for messages.
std::string decode_compiled_list(DecodeFormat format);

}  // namespace kvarn::cuda

#endif  // KVARN_CUDA_DECODE_INSTANCES_HPP_
